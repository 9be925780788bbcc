"""The discovery component the gateway owns: documents, routes, the backend fetcher and, in kube mode,
kube-apiserver's own aggregated discovery (`delegated.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aggregator.discovery.aggregated import (
    AggregatedDiscovery,
    VersionEntry,
    group_metadata,
    registration_entry,
)
from aggregator.discovery.delegated import DelegateDiscovery
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
            self.entries, on_render=gateway.metrics.discovery_aggregations.inc, metadata=self.group_metadata
        )
        # Kube mode: kube-apiserver's own groups (built-ins, CRDs) come from its aggregated `/apis`.
        self.delegate: DelegateDiscovery | None = None
        if gateway.options.kube_mode and gateway.kube is not None:
            self.delegate = DelegateDiscovery(
                gateway.kube, gateway.store, self._delegate_changed, metrics=gateway.metrics
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
        if self.delegate is not None:
            # apiregistration.k8s.io is kube-apiserver's there, listed in its document like any group.
            return self.delegate.entries(self.fetcher.states.values())
        return [registration_entry(), *self.fetcher.entries()]

    def group_metadata(self, name: str) -> dict[str, Any]:
        return self.delegate.group_metadata(name) if self.delegate is not None else group_metadata(name)

    def _delegate_changed(self) -> None:
        assert self.delegate is not None
        # A kube-apiserver without aggregated discovery: `/apis` answers as it does, legacy only.
        self.routes.aggregated = None if self.delegate.legacy_only else self.aggregated
        self.aggregated.invalidate()

    def install(self) -> None:
        self.routes.install()
        self.gateway.add_component(self)
        if self.delegate is not None:
            self.gateway.health.add("kube-apiserver-discovery", self.delegate.ready, livez=False)
        from aggregator.apiregistration import install_apiregistration

        self.apiregistration = install_apiregistration(self.gateway)

    async def start(self) -> None:
        await self.fetcher.start()
        if self.delegate is not None:
            await self.delegate.start()

    async def stop(self) -> None:
        if self.delegate is not None:
            await self.delegate.stop()
        await self.fetcher.stop()


def install_discovery(gateway: Gateway) -> Discovery:
    discovery = Discovery(gateway)
    discovery.install()
    return discovery
