"""Wire the proxy into a Gateway: backend transports, APIService routes, upgrade refusals, the delegate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.proxy.delegate import Delegate
from aggregator.proxy.handler import ProxyHandler
from aggregator.proxy.upgrade import upgrade_gate

if TYPE_CHECKING:
    from aggregator.server import Gateway


def install_proxy(gateway: Gateway) -> ProxyHandler:
    gateway.add_component(gateway.backends)
    if gateway.authenticator is not None:
        # Strip the front-proxy header names the authenticator reads now (flags or ConfigMap).
        gateway.backends.identity.follow(gateway.authenticator.requestheader)
    handler = ProxyHandler(gateway)
    gateway.router.add_resolver(handler.resolve)
    gateway.gates.append(upgrade_gate(gateway.metrics))
    if gateway.options.kube_mode and gateway.kube is not None:
        # Everything the gateway does not serve goes to kube-apiserver (local mode keeps the 404).
        delegate = Delegate(gateway, gateway.kube, handler.forwarder)
        gateway.add_component(delegate)
        gateway.router.fallback = delegate.route
    return handler
