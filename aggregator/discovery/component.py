"""Discovery as the gateway derives it: the documents, the backend fetcher and, in kube mode,
kube-apiserver's own aggregated discovery (`delegated.py`). `routes.py` serves them."""

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
from aggregator.kube.client import KubeClient
from aggregator.sources.store import Event, Store
from aggregator.web.context import RequestContext
from aggregator.web.serverrequest import Response
from aggregator.wire.negotiation import MediaType

# The /readyz check that waits for kube-apiserver's discovery (kube mode).
KUBE_DISCOVERY_CHECK = "kube-apiserver-discovery"


class Discovery:
    """The documents of `/apis` (legacy and aggregated) and `/apis/<group>`, kept up to date.

    `kube` is kube-apiserver in kube mode (its own groups, built-ins and CRDs, come from its
    aggregated `/apis`), None in local mode (the gateway lists `apiregistration.k8s.io` itself).
    `quarantine` names the APIServices left out of every document (`availability/quarantine.py`).
    `legacy_documents=False` in a process that serves no request (the control of `--workers N`:
    each worker builds the legacy documents from its own store): they are not kept up to date there.
    """

    def __init__(
        self,
        store: Store,
        *,
        backends: BackendFetcher,
        kube: KubeClient | None,
        metrics: DiscoveryMetrics,
        reachability: Reachability | None = None,
        quarantine: Quarantined | None = None,
        legacy_documents: bool = True,
    ) -> None:
        self.quarantine = quarantine
        self.legacy = LegacyDiscovery(store, quarantine=quarantine)
        self._legacy_documents = legacy_documents
        self.aggregated = AggregatedDiscovery(
            self.entries, on_render=metrics.aggregations.inc, metadata=self.group_metadata
        )
        self.delegate: DelegateDiscovery | None = None
        if kube is not None:
            self.delegate = DelegateDiscovery(kube, store, self._delegate_changed, metrics=metrics)
        self.fetcher = DiscoveryFetcher(
            store, backends, self.aggregated.invalidate, metrics=metrics, reachability=reachability
        )

    def on_store_event(self, event: Event) -> None:
        """Subscribe to the store (the composition root does): the legacy documents, kube-apiserver's
        discovery and the backend fetcher follow the objects, in that order."""
        if self._legacy_documents:
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
        if self._legacy_documents:
            self.legacy.quarantine_changed(name)
        self.aggregated.invalidate()

    def group_metadata(self, name: str) -> dict[str, Any]:
        return self.delegate.group_metadata(name) if self.delegate is not None else group_metadata(name)

    @property
    def legacy_only(self) -> bool:
        """A kube-apiserver without aggregated discovery: `/apis` answers as it does, legacy only."""
        return self.delegate is not None and self.delegate.legacy_only

    def serve_aggregated(self, ctx: RequestContext, media: MediaType) -> Response | None:
        """`routes.AggregatedEndpoint`: the aggregated document, unless kube-apiserver serves none."""
        return None if self.legacy_only else self.aggregated.serve(ctx, media)

    def _delegate_changed(self) -> None:
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
