"""Discovery as the gateway serves it: the documents, the routes, the backend fetcher and, in kube
mode, kube-apiserver's own aggregated discovery (`delegated.py`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggregator.contracts import BackendFetcher, Quarantined, Reachability
from aggregator.discovery.aggregated import (
    AggregatedDiscovery,
    VersionEntry,
    group_metadata,
    registration_entry,
)
from aggregator.discovery.delegated import DelegateDiscovery
from aggregator.discovery.fetcher import DiscoveryFetcher, FetchState
from aggregator.discovery.legacy import LegacyDiscovery
from aggregator.discovery.metrics import DiscoveryMetrics
from aggregator.discovery.routes import DiscoveryRoutes
from aggregator.kube.client import KubeClient
from aggregator.sources.store import Event, Store
from aggregator.web.routing import Handler

# The /readyz check that waits for kube-apiserver's discovery (kube mode).
KUBE_DISCOVERY_CHECK = "kube-apiserver-discovery"


class Discovery:
    """Serves `/apis` (legacy and aggregated) and `/apis/<group>`.

    `kube` is kube-apiserver in kube mode (its own groups, built-ins and CRDs, come from its
    aggregated `/apis`), None in local mode (the gateway lists `apiregistration.k8s.io` itself).
    `fallback` answers `/apis/<group>` for a group that vanished while the request was in flight.
    `quarantine` names the APIServices left out of every document (`availability/quarantine.py`).
    """

    def __init__(
        self,
        store: Store,
        *,
        backends: BackendFetcher,
        kube: KubeClient | None,
        metrics: DiscoveryMetrics,
        fallback: Handler,
        reachability: Reachability | None = None,
        quarantine: Quarantined | None = None,
    ) -> None:
        self.quarantine = quarantine
        self.legacy = LegacyDiscovery(store, quarantine=quarantine)
        self.aggregated = AggregatedDiscovery(
            self.entries, on_render=metrics.aggregations.inc, metadata=self.group_metadata
        )
        self.delegate: DelegateDiscovery | None = None
        if kube is not None:
            self.delegate = DelegateDiscovery(kube, store, self._delegate_changed, metrics=metrics)
        self.fetcher = DiscoveryFetcher(
            store, backends, self.aggregated.invalidate, metrics=metrics, reachability=reachability
        )
        self.routes = DiscoveryRoutes(self.legacy, self.aggregated, fallback)

    def on_store_event(self, event: Event) -> None:
        """Subscribe to the store (the composition root does): the legacy documents, kube-apiserver's
        discovery and the backend fetcher follow the objects, in that order."""
        self.legacy.on_store_event(event)
        if self.delegate is not None:
            self.delegate.on_store_event(event)
        self.fetcher.on_store_event(event)

    def entries(self) -> list[VersionEntry]:
        states: Iterable[FetchState] = self.fetcher.states.values()
        hidden = self.quarantine.quarantined if self.quarantine is not None else frozenset()
        gone: set[tuple[str, str]] = set()
        if hidden:
            gone = {(s.apiservice.group, s.apiservice.version) for s in states if s.apiservice.name in hidden}
            states = [s for s in states if s.apiservice.name not in hidden]
        if self.delegate is not None:
            # apiregistration.k8s.io is kube-apiserver's there, listed in its document like any group;
            # a quarantined group-version leaves kube-apiserver's copy too.
            entries = self.delegate.entries(states)
            return [e for e in entries if (e.group, e.version) not in gone] if gone else entries
        return [registration_entry(), *(state.entry() for state in states)]

    def quarantine_changed(self, name: str) -> None:
        """An APIService entered or left discovery quarantine (a listener of the quarantine)."""
        self.legacy.quarantine_changed(name)
        self.aggregated.invalidate()

    def group_metadata(self, name: str) -> dict[str, Any]:
        return self.delegate.group_metadata(name) if self.delegate is not None else group_metadata(name)

    def _delegate_changed(self) -> None:
        assert self.delegate is not None
        # A kube-apiserver without aggregated discovery: `/apis` answers as it does, legacy only.
        self.routes.aggregated = None if self.delegate.legacy_only else self.aggregated
        self.aggregated.invalidate()

    def kube_ready(self) -> str | None:
        """readyz `kube-apiserver-discovery`: kube-apiserver's discovery was fetched once (kube mode)."""
        return self.delegate.ready() if self.delegate is not None else None

    async def start(self) -> None:
        await self.fetcher.start()
        if self.delegate is not None:
            await self.delegate.start()

    async def stop(self) -> None:
        if self.delegate is not None:
            await self.delegate.stop()
        await self.fetcher.stop()
