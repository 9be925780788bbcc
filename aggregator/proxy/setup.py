"""Wire the proxy into a Gateway: backend transports, APIService routes, the delegate in kube mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggregator.server import Gateway


def install_proxy(gateway: Gateway) -> None:
    gateway.add_component(gateway.backends)
