"""The discovery component the gateway owns: routes, documents and (later) the backend fetcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.discovery.legacy import LegacyDiscovery
from aggregator.discovery.routes import DiscoveryRoutes

if TYPE_CHECKING:
    from aggregator.server import Gateway


class Discovery:
    """Serves `/apis` and `/apis/<group>`; a gateway component so it starts and stops with it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.legacy = LegacyDiscovery(gateway.store)
        self.routes = DiscoveryRoutes(gateway, self.legacy)

    def install(self) -> None:
        self.routes.install()
        self.gateway.add_component(self)
        from aggregator.apiregistration import install_apiregistration

        self.apiregistration = install_apiregistration(self.gateway)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def install_discovery(gateway: Gateway) -> Discovery:
    discovery = Discovery(gateway)
    discovery.install()
    return discovery
