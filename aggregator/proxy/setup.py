"""Wire the proxy into a Gateway: backend transports, APIService routes, upgrade refusals, the delegate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.proxy.handler import ProxyHandler
from aggregator.proxy.upgrade import upgrade_gate

if TYPE_CHECKING:
    from aggregator.server import Gateway


def install_proxy(gateway: Gateway) -> ProxyHandler:
    gateway.add_component(gateway.backends)
    handler = ProxyHandler(gateway)
    gateway.router.add_resolver(handler.resolve)
    gateway.gates.append(upgrade_gate(gateway.metrics))
    return handler
