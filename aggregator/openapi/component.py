"""The OpenAPI component the gateway owns: sources, their refresh loops, and what is published.

Sources: one per backend Service (every remote APIService pointing at the same Service, port and
caBundle shares one download) and, in kube mode, kube-apiserver itself. They refresh every 60 s,
at once when an APIService, its Service or its EndpointSlices change, and with backoff after a
failure or a 404; kube-apiserver's first download is retried every second instead, and awaited by
`/readyz` (`readiness.py`). Nothing is fetched on the request path: each change re-renders what is
served. Downloads start once the store has synced (before, a Service not listed yet would read as
missing, and kube-apiserver's document would be downloaded with the remote group-versions still in
it). A backend whose APIServices the availability checker all found unreachable
(`contracts.Reachability`) is not dialed: its last good documents stay, and it is downloaded again
as soon as the checker reaches one of them (`apiservice_changed`); meanwhile it is parked (a look
every 10 minutes as a backstop).

Published `/openapi/v3`: for each remote APIService, its backend's document for exactly its own
group-version (a backend cannot publish someone else's; one without `/openapi/v3` gets its v2
paths converted); in kube mode every other key from kube-apiserver (core, built-ins, CRDs, local
APIServices); in local mode the gateway's own `apiregistration.k8s.io/v1` (`local.py`).

Published `/openapi/v2`: kube-apiserver's document without the remote group-versions' paths (kube
mode; in local mode the gateway's own, with the `apiregistration.k8s.io/v1` paths) first, then
each remote APIService's paths under `/apis/<group>/<version>/`, in merge order (`merge_order`),
merged as kube-openapi merges (`merge.py`). An APIService in discovery quarantine
(`availability/quarantine.py`) is left out of both, kube-apiserver's copy included. The merge, JSON, protobuf and gzip renderings run in a worker thread, debounced,
and only when an input changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from multidict import CIMultiDict

from aggregator import __version__
from aggregator.contracts import UNREACHABLE_RECHECK, BackendFetcher, Quarantined, Reachability
from aggregator.kube.calls import GET_OPENAPI_V2, GET_OPENAPI_V3, GET_OPENAPI_V3_GROUP_VERSION
from aggregator.kube.client import KubeClient
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import AGGREGATOR
from aggregator.openapi import local
from aggregator.openapi.documents import Document
from aggregator.openapi.gnostic import CONTENT_TYPE as PROTOBUF_CONTENT_TYPE
from aggregator.openapi.gnostic import encode_document
from aggregator.openapi.merge import JSON, drop_prefixes, filter_paths, keep_prefixes, merge_documents
from aggregator.openapi.metrics import OpenAPIMetrics
from aggregator.openapi.readiness import FirstDownload
from aggregator.openapi.sources import V2_PATH, V3_ROOT, Answer, OpenAPISource
from aggregator.sources.store import Event, Kind, Store
from aggregator.util.backoff import exponential_delay
from aggregator.util.coalesce import Throttled
from aggregator.util.logs import fields
from aggregator.util.loops import KeyedLoops
from aggregator.util.tasks import TaskSet
from aggregator.wire.jsonenc import go_marshal

log = logging.getLogger(__name__)

KUBE_APISERVER = "kube-apiserver"
# At most one source sync and v3 index re-publish per this many seconds (a read in between applies it).
SYNC_INTERVAL = 0.25
# A v2 merge is followed by at least this many times its own duration before the next one.
MERGE_SPACING = 9.0
# (namespace, name, port, caBundle, insecureSkipTLSVerify): APIServices equal here share a download.
BackendKey = tuple[str, str, int, bytes, bool]
SourceKey = BackendKey | str


def gv_key(svc: APIService) -> str:
    """The `/openapi/v3` key of an APIService's group-version."""
    return f"apis/{svc.group}/{svc.version}" if svc.group else f"api/{svc.version}"


def gv_prefix(svc: APIService) -> str:
    """The v2 path prefix an APIService's paths live under (upstream's filter)."""
    return f"/apis/{svc.group}/{svc.version}/" if svc.group else f"/api/{svc.version}/"


def backend_key(svc: APIService) -> BackendKey:
    assert svc.service is not None
    ref = svc.service
    return (ref.namespace, ref.name, ref.port, svc.ca_bundle, svc.insecure_skip_tls_verify)


def merge_order(apiservices: Iterable[APIService]) -> list[APIService]:
    """Remote APIServices in the order their v2 documents merge (earlier ones keep their names).

    Groups by priority (the highest groupPriorityMinimum of the group's remote APIServices),
    descending; inside a group by versionPriority, descending, then name. Upstream compares a
    group's members by name only: its comparator reads versionPriority from the same APIService
    twice (`jPriority = a.apiServices[i].Spec.VersionPriority`). Groups of equal priority go by
    group name, which keeps the order total (upstream falls back to APIService names there).
    """
    remote = [s for s in apiservices if not s.local]
    priority: dict[str, int] = {}
    for svc in remote:
        priority[svc.group] = max(
            priority.get(svc.group, svc.group_priority_minimum), svc.group_priority_minimum
        )
    return sorted(remote, key=lambda s: (-priority[s.group], s.group, -s.version_priority, s.name))


# --- what is served ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class V3Published:
    index: Document
    documents: Mapping[str, Document]


@dataclass(frozen=True, slots=True)
class V2Published:
    json: Document
    protobuf: Document
    sources: tuple[str, ...] = ()  # what was merged, in order
    skipped: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class V2Input:
    """One document to merge: a source's spec and which of its paths to take."""

    name: str
    spec: JSON | bytes  # a document, or its JSON text
    keep: tuple[str, ...] = ()  # only paths under these prefixes (a remote group-version)
    drop: tuple[str, ...] = ()  # none under these (kube-apiserver: the remote group-versions)
    revision: tuple[str, int] = ("", 0)  # (source, its v2 revision): equal inputs skip the merge


def base_document() -> JSON:
    """What heads the merged v2 document when kube-apiserver's does not (local mode)."""
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": f"v{__version__}"}, "paths": {}}


def render_v3_index(documents: Mapping[str, Document]) -> bytes:
    """kube-openapi's `OpenAPIV3Discovery`: keys sorted (a Go map), URLs with the current hash."""
    return go_marshal(
        {
            "paths": {
                key: {"serverRelativeURL": f"{V3_ROOT}/{key}?{_hash_query(documents[key].etag)}"}
                for key in sorted(documents)
            }
        }
    )


def _hash_query(etag: str) -> str:
    """`hash=<etag>`, form-encoded (a hex digest, as every rendered document's is, needs no encoding:
    the index of 5000 group-versions is rendered on every change, and `urlencode` was most of it)."""
    return f"hash={etag}" if etag.isascii() and etag.isalnum() else urlencode({"hash": etag})


def build_v2(inputs: Sequence[V2Input]) -> V2Published:
    """Filter, merge and render every representation (CPU-bound: runs in a worker thread)."""
    specs: list[tuple[str, JSON]] = []
    for item in inputs:
        spec = json.loads(item.spec) if isinstance(item.spec, bytes) else item.spec
        if item.keep:
            spec = filter_paths(spec, keep_prefixes(item.keep))
        if item.drop:
            spec = filter_paths(spec, drop_prefixes(item.drop))
        specs.append((item.name, spec))
    result = merge_documents(specs)
    json_doc = Document.render(go_marshal(result.document), compress=True)
    # kube-openapi serves the protobuf under the JSON's ETag ("because of the Vary header").
    protobuf = Document.render(
        encode_document(result.document), PROTOBUF_CONTENT_TYPE, etag=json_doc.etag, compress=True
    )
    return V2Published(json_doc, protobuf, tuple(name for name, _ in specs), result.skipped)


EMPTY_V3 = V3Published(Document.render(render_v3_index({})), {})


# --- getters ----------------------------------------------------------------------------------------


class BackendGetter:
    """GETs against the backend of a group of APIServices, through the proxy's transport."""

    __slots__ = ("_key", "_owner")

    def __init__(self, owner: OpenAPIAggregation, key: BackendKey) -> None:
        self._owner = owner
        self._key = key

    # What its source asks of the backend's APIServices, read live: bound methods of the getter
    # each source already holds, instead of three closures more per backend.
    def names(self) -> list[str]:
        return [s.name for s in self._owner.members.get(self._key, ())]

    def group_versions(self) -> list[str]:
        return [gv_key(s) for s in self._owner.members.get(self._key, ())]

    def wants(self, gv: str) -> bool:
        return any(gv_key(s) == gv for s in self._owner.members.get(self._key, ()))

    async def __call__(self, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer:
        members = self._owner.members.get(self._key)
        if not members:
            raise RuntimeError("no APIService uses this backend any more")
        backends = self._owner.backends
        target = path + ("?" + urlencode(query) if query else "")
        resp = await backends.fetch(
            members[0], target, headers=headers, user=AGGREGATOR, timeout=self._owner.timeout
        )
        return Answer(resp.status, resp.headers, resp.body)


class KubeGetter:
    """GETs against kube-apiserver's own OpenAPI, as declared calls of the gateway's client."""

    def __init__(self, kube: KubeClient, timeout: float) -> None:
        self._kube = kube
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=5.0)

    async def __call__(self, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer:
        name = None
        if path == V2_PATH:
            call = GET_OPENAPI_V2
        elif path == V3_ROOT:
            call = GET_OPENAPI_V3
        elif path.startswith(V3_ROOT + "/"):
            call, name = GET_OPENAPI_V3_GROUP_VERSION, path[len(V3_ROOT) + 1 :]
        else:
            raise ValueError(f"not an OpenAPI path: {path}")
        resp = await self._kube.request(
            call, name=name, params=dict(query) or None, headers=headers, client_timeout=self._timeout
        )
        return Answer(resp.status, CIMultiDict(resp.headers), resp.body)


# --- the component ----------------------------------------------------------------------------------


@dataclass
class _V2State:
    signature: tuple[Any, ...] | None = None
    dirty: bool = False
    task: asyncio.Task[None] | None = None


class OpenAPIAggregation:
    def __init__(
        self,
        store: Store,
        *,
        backends: BackendFetcher,
        kube: KubeClient | None,
        metrics: OpenAPIMetrics,
        local_mode: bool,
        refresh_interval: float = 60.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        timeout: float = 30.0,
        debounce: float = 0.05,
        concurrency: int = 4,
        first_download: FirstDownload | None = None,
        reachability: Reachability | None = None,
        quarantine: Quarantined | None = None,
    ) -> None:
        self.store = store
        self.backends = backends
        self.quarantine = quarantine
        self.reachability = reachability
        self.kube = kube
        self.metrics = metrics
        self.timeout = timeout
        self.debounce = debounce
        self.kube_mode = not local_mode
        self.sources: dict[SourceKey, OpenAPISource] = {}
        # Remote APIServices per backend, by name (the first one makes the backend calls).
        self.members: dict[BackendKey, list[APIService]] = {}
        self._backend_of: dict[str, BackendKey] = {}  # remote APIService name -> its backend
        self._parked: set[BackendKey] = set()  # unreachable: waiting for the checker's word
        self.first_download = first_download or FirstDownload()
        self.refresher: KeyedLoops[SourceKey] = KeyedLoops(
            "openapi",
            self._refresh,
            interval=refresh_interval,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            concurrency=concurrency,
            delay=self._next_delay,
        )
        # Local mode serves apiregistration.k8s.io/v1 itself, so it publishes its documents too:
        # they win over any backend's, as the gateway's own handler wins over any APIService.
        self._own_v3: dict[str, Document] = {}
        self._own_v2: JSON = base_document()
        if local_mode:
            own_v3, own_v2 = local.build_documents()
            self._own_v3 = {local.KEY: Document.render(go_marshal(own_v3))}
            self._own_v2 = own_v2
        self._v3: V3Published = EMPTY_V3
        # Thousands of APIServices and sources change within seconds at start-up: matching sources
        # and re-publishing the v3 index happen once per burst (or at the next read).
        self._sync_pending = False
        self._v3_pending = False
        self._coalesced = Throttled(self._flush, interval=SYNC_INTERVAL, name="openapi")
        self.v2: V2Published = build_v2([V2Input("gateway", self._own_v2)])
        self._v2 = _V2State()
        self._tasks = TaskSet("openapi")
        self._remote_keys: frozenset[str] = frozenset()
        self._started = False
        self._publish_v3()

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Downloads begin once the store has synced (at once in local mode)."""
        self.store.when_synced(self._tasks, self._begin, name="start")

    def _begin(self) -> None:
        self._started = True
        if self.kube_mode and self.kube is not None:
            kube = OpenAPISource(
                KUBE_APISERVER,
                KubeGetter(self.kube, self.timeout),
                wants=lambda key: key not in self._remote_keys,
                metrics=self.metrics,
            )
            self.sources[KUBE_APISERVER] = kube
            self.refresher.ensure(KUBE_APISERVER)
        self._sync()
        self.refresher.start()

    def apiservice_changed(self, name: str) -> None:
        """The availability checker's verdict on this APIService changed: if its backend is
        reachable again (parked as unreachable, or its last download could not reach it),
        download its documents now instead of at the end of a backoff (a listener of
        `AvailabilityChecker`)."""
        key = self._backend_of.get(name)
        if key is None or self._unreachable(key):
            return
        source = self.sources.get(key)
        if key in self._parked or (source is not None and source.unreachable):
            self._parked.discard(key)
            self.refresher.poke(key)

    def quarantine_changed(self, _name: str) -> None:
        """An APIService entered or left discovery quarantine: publish without (or with) it again."""
        self._publish_v3()
        self._schedule_v2()

    def _hidden(self) -> frozenset[str]:
        return self.quarantine.quarantined if self.quarantine is not None else frozenset()

    def _unreachable(self, key: SourceKey) -> bool:
        """Every APIService of this backend was found unreachable by the last check."""
        reachability = self.reachability
        if reachability is None or isinstance(key, str):
            return False
        members = self.members.get(key, [])
        return bool(members) and all(reachability.unreachable(s.name) is not None for s in members)

    def _awaiting(self, key: SourceKey) -> bool:
        """No APIService of this backend has had its first check yet: that check dials it first."""
        reachability = self.reachability
        if reachability is None or isinstance(key, str):
            return False
        members = self.members.get(key, [])
        return bool(members) and all(reachability.awaiting_check(s.name) for s in members)

    async def stop(self) -> None:
        self._started = False
        self._coalesced.cancel()
        await self.refresher.stop()
        await self._tasks.close()
        self._v2.task = None

    # --- what changed --------------------------------------------------------------------------------

    @property
    def v3(self) -> V3Published:
        """What `/openapi/v3` serves now (pending changes are applied first)."""
        if self._sync_pending or self._v3_pending:
            self._flush()
        return self._v3

    def v3_if_published(self) -> V3Published | None:
        """`v3`, or None while a coalesced publish is due: a reader that polls for changes
        (`workers/publisher.py`) publishes nothing of its own, so a burst costs one publish."""
        if (self._sync_pending or self._v3_pending) and self._coalesced.pending:
            return None
        return self.v3

    def _flush(self) -> None:
        if self._sync_pending:
            self._sync_pending = False
            self._sync()
        elif self._v3_pending:
            self._publish_v3()

    def on_store_event(self, event: Event) -> None:
        if not self._started:
            return
        if event.kind is Kind.APISERVICE:
            if not event.status_only:  # conditions change no source and no document
                self._sync_pending = True
                self._coalesced.request()
            return
        services = event.services()
        for key in self.members:
            if (key[0], key[1]) in services:
                self.refresher.poke(key)

    def _sync(self) -> None:
        """Match sources to the store's remote APIServices; republish what their change affects."""
        members: dict[BackendKey, list[APIService]] = {}
        for svc in sorted(self.store.apiservices(), key=lambda s: s.name):
            if not svc.local:
                members.setdefault(backend_key(svc), []).append(svc)
        previous = self.members
        self.members = members
        self._backend_of = {s.name: key for key, group in members.items() for s in group}
        retired = {
            k: self.sources.pop(k) for k in list(self.sources) if k != KUBE_APISERVER and k not in members
        }
        for key in retired:
            self.refresher.discard(key)
            self._parked.discard(key)
        for key, group in members.items():
            if key not in self.sources:
                getter = BackendGetter(self, key)
                source = OpenAPISource(
                    f"{key[0]}/{key[1]}:{key[2]}",
                    getter,
                    wants=getter.wants,
                    metrics=self.metrics,
                    legacy_keys=getter.group_versions,
                    apiservices=getter.names,
                )
                # Same server, new TLS settings (a rotated caBundle): serve its documents until
                # the first download through the new settings replaces them.
                for old_key, old in retired.items():
                    if old_key[:3] == key[:3]:
                        source.v3, source.v2, source.v2_revision = dict(old.v3), old.v2, old.v2_revision + 1
                        break
                self.sources[key] = source
                self.refresher.ensure(key)
            elif [gv_key(s) for s in group] != [gv_key(s) for s in previous.get(key, [])]:
                self.refresher.poke(key)  # a group-version was added: download its document
        remote_keys = frozenset(gv_key(s) for group in members.values() for s in group)
        if remote_keys != self._remote_keys:
            self._remote_keys = remote_keys
            self.refresher.poke(KUBE_APISERVER)
        self._publish_v3()
        self._schedule_v2()

    def _next_delay(self, key: SourceKey, ok: bool, failures: int) -> float | None:
        """kube-apiserver's failed first download: again within a second, not on the backoff. An
        unreachable backend: parked (the checker pokes it when it is back; `UNREACHABLE_RECHECK`
        is the backstop)."""
        if isinstance(key, tuple):
            if self._awaiting(key) or (not ok and self._unreachable(key)):
                self._parked.add(key)
                return max(self.refresher.interval, UNREACHABLE_RECHECK)
            self._parked.discard(key)
        source = self.sources.get(key) if key == KUBE_APISERVER else None
        if ok or source is None:
            return None
        refresher = self.refresher
        return self.first_download.retry_delay(
            source, exponential_delay(failures, refresher.backoff_initial, refresher.backoff_max)
        )

    def kube_ready(self) -> str | None:
        """readyz `kube-apiserver-openapi` (kube mode): kube-apiserver's documents are served."""
        if not self.kube_mode or self.kube is None:
            return None
        source = self.sources.get(KUBE_APISERVER)
        return self.first_download.check(source, self._kube_v2_merged(source))

    def _kube_v2_merged(self, source: OpenAPISource | None) -> bool:
        """The published v2 was merged from kube-apiserver's current v2 document."""
        signature = self._v2.signature or ()
        return source is not None and any(
            item[0] == KUBE_APISERVER and item[1] == (source.name, source.v2_revision) for item in signature
        )

    async def _refresh(self, key: SourceKey) -> bool:
        source = self.sources.get(key)
        if source is None:
            return True
        if self._awaiting(key):
            return True  # the first check goes first; its verdict pokes this key (`apiservice_changed`)
        if self._unreachable(key):
            return False  # not dialed: the last good documents stay
        result = await source.refresh()
        if self.sources.get(key) is not source:
            return result.ok  # removed while it ran
        if result.v3_changed:
            self._publish_v3_later()
        if result.v2_changed:
            self._schedule_v2()
        return result.ok

    # --- publishing ----------------------------------------------------------------------------------

    def _publish_v3_later(self) -> None:
        self._v3_pending = True
        self._coalesced.request()

    def _publish_v3(self) -> None:
        self._v3_pending = False
        documents: dict[str, Document] = {}
        kube = self.sources.get(KUBE_APISERVER)
        if kube is not None:
            documents.update((k, d) for k, d in kube.v3.items() if k not in self._remote_keys)
        hidden = self._hidden()
        for key, group in self.members.items():
            source = self.sources.get(key)
            if source is None:
                continue
            for svc in group:
                if svc.name in hidden:
                    continue
                doc = source.v3.get(gv_key(svc))
                if doc is not None:
                    documents[gv_key(svc)] = doc
        documents.update(self._own_v3)
        index = render_v3_index(documents)
        if index != self._v3.index.body or documents.keys() != self._v3.documents.keys():
            self._v3 = V3Published(Document.render(index), documents)

    def v2_inputs(self) -> list[V2Input]:
        """What the next v2 merge takes, in order."""
        inputs: list[V2Input] = []
        kube = self.sources.get(KUBE_APISERVER)
        remote = merge_order(s for group in self.members.values() for s in group)
        if kube is not None and kube.v2 is not None:
            drop = tuple(sorted(gv_prefix(s) for s in remote))
            inputs.append(V2Input(KUBE_APISERVER, kube.v2, drop=drop, revision=(kube.name, kube.v2_revision)))
        else:
            inputs.append(V2Input("gateway", self._own_v2))
        hidden = self._hidden()
        for svc in remote:
            if svc.name in hidden:
                continue  # kube-apiserver's copy is dropped above with every remote group-version
            source = self.sources.get(backend_key(svc))
            if source is not None and source.v2 is not None:
                revision = (source.name, source.v2_revision)
                inputs.append(V2Input(svc.name, source.v2, keep=(gv_prefix(svc),), revision=revision))
        return inputs

    def _schedule_v2(self) -> None:
        self._v2.dirty = True
        if not self._started:
            return
        if self._v2.task is None or self._v2.task.done():
            self._v2.task = self._tasks.spawn(self._rebuild_v2(), name="v2-merge")

    async def _rebuild_v2(self) -> None:
        await asyncio.sleep(self.debounce)  # let a burst of changes settle into one merge
        while self._v2.dirty:
            self._v2.dirty = False
            inputs = self.v2_inputs()
            signature = tuple((i.name, i.revision, i.keep, i.drop) for i in inputs)
            if signature == self._v2.signature:
                continue
            started = time.monotonic()
            try:
                published = await asyncio.to_thread(build_v2, inputs)
            except Exception:
                log.exception("merging OpenAPI v2 failed; serving the previous document")
                continue
            self._v2.signature = signature
            self.v2 = published
            elapsed = time.monotonic() - started
            self.metrics.v2_merges.inc()
            self.metrics.v2_merge_duration.set(elapsed)
            for name, reason in published.skipped:
                log.warning(
                    "OpenAPI v2 document left out of the merge", extra=fields(source=name, reason=reason)
                )
            log.debug(
                "OpenAPI v2 merged",
                extra=fields(sources=len(inputs), bytes=len(published.json.body), seconds=round(elapsed, 3)),
            )
            # Thousands of sources arrive one by one at start-up: the next merge waits in proportion
            # to what this one cost, so merging takes at most a tenth of a core however big it is.
            await asyncio.sleep(max(self.debounce, elapsed * MERGE_SPACING))
