"""The discovery component the gateway owns: documents, routes and the backend fetcher."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aggregator.discovery.aggregated import AggregatedDiscovery, VersionEntry, registration_entry
from aggregator.discovery.fetcher import Backends, DiscoveryFetcher
from aggregator.discovery.legacy import LegacyDiscovery
from aggregator.discovery.routes import DiscoveryRoutes

if TYPE_CHECKING:
    from aggregator.apiregistration import APIRegistration
    from aggregator.server import Gateway


class Discovery:
    """Serves `/apis` (legacy and aggregated) and `/apis/<group>`; starts and stops with the gateway."""

    def __init__(self, gateway: Gateway, **fetcher_options: Any) -> None:
        self.gateway = gateway
        self.legacy = LegacyDiscovery(gateway.store)
        self.aggregated = AggregatedDiscovery(
            self.entries, on_render=gateway.metrics.discovery_aggregations.inc
        )
        self.fetcher = DiscoveryFetcher(
            gateway.store,
            self._backends,
            self.aggregated.invalidate,
            metrics=gateway.metrics,
            **fetcher_options,
        )
        self.routes = DiscoveryRoutes(gateway, self.legacy)
        self.routes.aggregated = self.aggregated
        self.apiregistration: APIRegistration | None = None

    def _backends(self) -> Backends | None:
        """The proxy's transport, once it is wired (`gateway.backends`)."""
        backends: Backends | None = getattr(self.gateway, "backends", None)
        return backends

    def entries(self) -> list[VersionEntry]:
        return [registration_entry(), *self.fetcher.entries()]

    def install(self) -> None:
        self.routes.install()
        self.gateway.add_component(self)
        from aggregator.apiregistration import install_apiregistration

        self.apiregistration = install_apiregistration(self.gateway)

    async def start(self) -> None:
        await self.fetcher.start()

    async def stop(self) -> None:
        await self.fetcher.stop()


def install_discovery(gateway: Gateway) -> Discovery:
    discovery = Discovery(gateway)
    discovery.install()
    return discovery
