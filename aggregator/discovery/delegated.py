"""Kube mode: kube-apiserver's own aggregated discovery, fetched in the background and merged with ours.

kube-apiserver's `/apis` (aggregated) is one ResourceManager's rendering of three sources: its
built-in groups, its CRD groups and its own aggregator's remote APIServices. The gateway fetches
that document as itself (the declared call `GET_APIS`, granted by the built-in `system:discovery`
role) and keeps every group-version of it that is not a remote APIService the gateway fetches on
its own; those come from the gateway's fetcher, with its Stale-but-served freshness. Until the
gateway's first fetch of a remote group-version has finished, kube-apiserver's copy stands in.

Priorities are upstream's ResourceManager inputs, recovered per group-version (`Priorities`):
`apiregistration.k8s.io/v1` 20001/0; a remote APIService's spec (AggregatorSource wins over every
other source); the built-in table; CRD versions 1000/100, recognised by the local APIService
kube-apiserver's crdregistration controller keeps for each served CRD version (label
`kube-aggregator.kubernetes.io/automanaged: "true"`; built-ins are `onstart`); anything else
1000/15 (a built-in missing from the table). With those, `merge_items` orders the groups and
versions as kube-apiserver does, so when every aggregated backend is reachable the gateway's
document equals kube-apiserver's byte for byte (group metadata included: <= 1.33 writes
`"creationTimestamp":null`, and we copy kube-apiserver's style).

Fetching: `Accept` v2 then v2beta1 (1.26-1.29 serve only v2beta1, whose JSON is field for field
v2's, so accepting it is all the conversion there is) with `If-None-Match`; every 60 s, soon after
an APIService change (kube-apiserver publishes a new CRD group a moment after its APIService
appears, so a few follow-up fetches at 0.5, 1, 2 and 4 s catch it; they are 304s otherwise), and
with backoff from 0.5 s to 60 s after a failure. Never on the request path: `/apis` serves what was
fetched last, and only the aggregated groups until the first fetch succeeds. A kube-apiserver that
answers with a plain APIGroupList (no aggregated discovery: < 1.26, or the feature disabled) makes
the gateway serve legacy discovery only, as that kube-apiserver does itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from aggregator.discovery.aggregated import (
    CRD_PRIORITY,
    DEFAULT_PRIORITY,
    REGISTRATION_GROUP_PRIORITY,
    VersionEntry,
    group_metadata,
    load_builtin_priorities,
)
from aggregator.discovery.fetcher import AGGREGATED_ACCEPT, FetchState, is_aggregated_content_type
from aggregator.discovery.metrics import DiscoveryMetrics
from aggregator.kube.calls import GET_APIS
from aggregator.kube.client import describe_error
from aggregator.model.apiservice import API_VERSION as REGISTRATION_GROUP_VERSION
from aggregator.model.apiservice import APIService
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.util.logs import fields
from aggregator.util.loops import KeyedLoops, LoopComponent
from aggregator.wire.negotiation import DISCOVERY_KIND

if TYPE_CHECKING:
    from aggregator.kube.client import KubeClient, KubeResponse

log = logging.getLogger(__name__)

# The `apiservice` label value of the discovery metrics for this fetch (no APIService name lacks a dot).
KUBE_APISERVER = "kube-apiserver"
AUTOMANAGED_LABEL = "kube-aggregator.kubernetes.io/automanaged"
AUTOMANAGED_CRD = "true"  # crdregistration controller; built-ins are "onstart"

PENDING, CURRENT, FAILING, LEGACY = "pending", "current", "failing", "legacy"

GroupVersion = tuple[str, str]


class DocumentError(Exception):
    """kube-apiserver answered, but not with a usable aggregated discovery document."""


# --- the document ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeGroupVersion:
    """One version entry of kube-apiserver's document, resources kept as kube-apiserver wrote them."""

    group: str
    version: str
    resources: tuple[Mapping[str, Any], ...]
    freshness: str


@dataclass(frozen=True, slots=True)
class KubeDocument:
    versions: tuple[KubeGroupVersion, ...]
    # Each group's `metadata` as written, and what kube-apiserver adds beside the name (<= 1.33:
    # `"creationTimestamp": null`), for groups only the gateway knows.
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    metadata_extras: Mapping[str, Any] = field(default_factory=dict)
    etag: str = field(default="", compare=False)

    def group_metadata(self, name: str) -> dict[str, Any]:
        found = self.metadata.get(name)
        if found is not None:
            return dict(found)
        return {**group_metadata(name), **self.metadata_extras}

    @property
    def group_versions(self) -> frozenset[GroupVersion]:
        return frozenset((v.group, v.version) for v in self.versions)


def parse_document(body: bytes, etag: str = "") -> KubeDocument:
    """An APIGroupDiscoveryList (v2 or v2beta1) as kube-apiserver serves it at `/apis`."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise DocumentError(f"invalid aggregated discovery document: {err}") from err
    if not isinstance(doc, dict) or doc.get("kind", DISCOVERY_KIND) != DISCOVERY_KIND:
        raise DocumentError("the document is not an APIGroupDiscoveryList")
    items = doc.get("items")
    if not isinstance(items, list):
        raise DocumentError("the APIGroupDiscoveryList has no items")
    versions: list[KubeGroupVersion] = []
    metadata: dict[str, Mapping[str, Any]] = {}
    extras: dict[str, Any] = {}
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        name = meta.get("name", "")
        if not isinstance(name, str):
            continue
        if not metadata and "creationTimestamp" in meta:
            extras["creationTimestamp"] = meta["creationTimestamp"]
        metadata.setdefault(name, meta)
        for entry in item.get("versions") or ():
            version = entry.get("version") if isinstance(entry, dict) else None
            if not isinstance(version, str) or not version:
                continue
            resources = entry.get("resources") or ()
            freshness = entry.get("freshness") or ""
            versions.append(
                KubeGroupVersion(
                    name,
                    version,
                    tuple(r for r in resources if isinstance(r, dict)) if isinstance(resources, list) else (),
                    freshness if isinstance(freshness, str) else "",
                )
            )
    return KubeDocument(tuple(versions), metadata, extras, etag)


def is_group_list(resp: KubeResponse) -> bool:
    """A plain APIGroupList: this kube-apiserver does not serve aggregated discovery."""
    try:
        doc = json.loads(resp.body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == "APIGroupList"


def header(headers: Mapping[str, str], name: str) -> str:
    """A response header by name, whatever its case (`KubeResponse.headers` is a plain dict)."""
    wanted = name.lower()
    return next((value for key, value in headers.items() if key.lower() == wanted), "")


def _answer_excerpt(resp: KubeResponse) -> str:
    try:
        doc = json.loads(resp.body)
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])
    except (ValueError, UnicodeDecodeError):
        pass
    return resp.body[:200].decode("utf-8", "replace").strip()


# --- priorities and merge --------------------------------------------------------------------------


def automanaged(svc: APIService) -> str:
    labels = (svc.raw.get("metadata") or {}).get("labels") or {}
    value = labels.get(AUTOMANAGED_LABEL, "") if isinstance(labels, Mapping) else ""
    return value if isinstance(value, str) else ""


class Priorities:
    """(groupPriorityMinimum, versionPriority) of a group-version in kube-apiserver's document."""

    def __init__(self, store: Store, table: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.store = store
        self.table = dict(load_builtin_priorities() if table is None else table)

    def __call__(self, group: str, version: str) -> tuple[int, int]:
        group_version = f"{group}/{version}" if group else version
        if group_version == REGISTRATION_GROUP_VERSION:
            return REGISTRATION_GROUP_PRIORITY, 0
        svc = self.store.apiservice(f"{version}.{group}")
        if svc is not None and not svc.local:
            return svc.group_priority_minimum, svc.version_priority
        builtin = self.table.get(group_version)
        if builtin is not None:
            return builtin
        if svc is not None and automanaged(svc) == AUTOMANAGED_CRD:
            return CRD_PRIORITY
        return DEFAULT_PRIORITY


def merge_entries(
    document: KubeDocument | None,
    remote: Iterable[FetchState],
    priority: Callable[[str, str], tuple[int, int]],
) -> list[VersionEntry]:
    """kube-apiserver's group-versions, except the remote ones the gateway has fetched itself."""
    own: list[VersionEntry] = []
    waiting: dict[GroupVersion, FetchState] = {}
    for state in remote:
        if state.attempted:
            own.append(state.entry())
        else:
            waiting[(state.apiservice.group, state.apiservice.version)] = state
    claimed = {(e.group, e.version) for e in own}
    entries: list[VersionEntry] = []
    for gv in document.versions if document is not None else ():
        key = (gv.group, gv.version)
        if key in claimed:
            continue
        waiting.pop(key, None)  # kube-apiserver's copy until the gateway's own first fetch ends
        group_priority, version_priority = priority(gv.group, gv.version)
        entries.append(
            VersionEntry(gv.group, gv.version, group_priority, version_priority, gv.resources, gv.freshness)
        )
    entries.extend(state.entry() for state in waiting.values())
    entries.extend(own)
    return entries


# --- the fetch loop --------------------------------------------------------------------------------


def _spec_of(svc: APIService) -> tuple[object, ...]:
    """What of an APIService can move its group-version's priority (conditions cannot)."""
    return (
        svc.group,
        svc.version,
        svc.local,
        svc.group_priority_minimum,
        svc.version_priority,
        automanaged(svc),
    )


class DelegateDiscovery(LoopComponent):
    """kube-apiserver's aggregated `/apis`, kept fresh; `on_change` runs when what it contributes changes."""

    def __init__(
        self,
        kube: KubeClient,
        store: Store,
        on_change: Callable[[], None],
        *,
        metrics: DiscoveryMetrics | None = None,
        refresh_interval: float = 60.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 60.0,
        timeout: float = 10.0,
        follow_ups: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0),
    ) -> None:
        self.kube = kube
        self.store = store
        self._on_change = on_change
        self._metrics = metrics
        self.timeout = timeout
        self.follow_ups = follow_ups
        self.priority = Priorities(store)
        self.document: KubeDocument | None = None
        self.served_version = ""  # v2 or v2beta1, as kube-apiserver answered
        self.legacy_only = False  # kube-apiserver answered with a plain APIGroupList
        self.state = PENDING
        self.attempted = False
        self.failures = 0
        self.last_error = ""
        self._pending_follow_ups: list[float] = []
        # One key on the shared engine: its interval, backoff and a poke-means-again wake.
        self.loops: KeyedLoops[str] = KeyedLoops(
            "discovery-kube-apiserver",
            self._fetch,
            interval=refresh_interval,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            concurrency=1,
            delay=self._follow_up,
        )
        self.loops.ensure(KUBE_APISERVER)

    # --- lifecycle (start and stop run the loops: LoopComponent) ---------------------------------------

    def ready(self) -> str | None:
        """Readiness: the first fetch has finished (like upstream's initial discovery sync, errors allowed)."""
        return None if self.attempted else "kube-apiserver's discovery has not been fetched yet"

    # --- what the merge reads -----------------------------------------------------------------------

    def entries(self, remote: Iterable[FetchState]) -> list[VersionEntry]:
        return merge_entries(self.document, remote, self.priority)

    def group_metadata(self, name: str) -> dict[str, Any]:
        return self.document.group_metadata(name) if self.document is not None else group_metadata(name)

    # --- triggers -----------------------------------------------------------------------------------

    def poke(self, *, follow_up: bool = False) -> None:
        """Fetch now (or right after the fetch in progress); `follow_up` adds the short re-checks."""
        if follow_up:
            self._pending_follow_ups = list(self.follow_ups)
        self.loops.poke(KUBE_APISERVER)

    def on_store_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE:
            return
        new = event.obj
        old = event.old
        assert isinstance(new, APIService)
        if event.type != DELETED and isinstance(old, APIService) and _spec_of(old) == _spec_of(new):
            return  # a status write: nothing kube-apiserver publishes depends on it
        self._on_change()  # a priority may have moved (a CRD's label, local <-> remote)
        self.poke(follow_up=True)

    async def _fetch(self, _key: str) -> bool:
        return await self.fetch_once()

    def _follow_up(self, _key: str, ok: bool, _failures: int) -> float | None:
        """After a change, a few quick re-fetches (kube-apiserver publishes a CRD's group a moment
        after its APIService appears); otherwise the engine's interval or backoff."""
        if ok and self._pending_follow_ups:
            return self._pending_follow_ups.pop(0)
        return None

    # --- one fetch ----------------------------------------------------------------------------------

    async def fetch_once(self) -> bool:
        """One GET of kube-apiserver's `/apis`; returns whether it gave a definite answer."""
        started = time.time()
        headers = {"Accept": AGGREGATED_ACCEPT}
        if self.document is not None and self.document.etag:
            headers["If-None-Match"] = self.document.etag
        try:
            # The client timeout bounds the call; this backstop also covers loading credentials.
            async with asyncio.timeout(self.timeout + 5):
                resp = await self.kube.request(
                    GET_APIS,
                    headers=headers,
                    client_timeout=aiohttp.ClientTimeout(
                        total=self.timeout, sock_connect=min(self.timeout, 5)
                    ),
                )
            result, document = self._interpret(resp)
        except (Exception, TimeoutError) as err:
            self._failed(describe_error(err) if not isinstance(err, DocumentError) else str(err))
            return False
        self._succeeded(result, document, started)
        return True

    def _interpret(self, resp: KubeResponse) -> tuple[str, KubeDocument | None]:
        if resp.status == 304 and self.document is not None:
            return "not_modified", self.document
        content_type = header(resp.headers, "Content-Type")
        if resp.status == 200 and is_aggregated_content_type(content_type):
            params = dict(p.strip().partition("=")[::2] for p in content_type.split(";")[1:])
            self.served_version = params.get("v", "")
            return "aggregated", parse_document(resp.body, header(resp.headers, "ETag"))
        if resp.status == 200 and is_group_list(resp):
            return "legacy", None
        raise DocumentError(f"GET /apis answered {resp.status}: {_answer_excerpt(resp)}")

    def _succeeded(self, result: str, document: KubeDocument | None, started: float) -> None:
        previous, was_legacy, failures = self.state, self.legacy_only, self.failures
        changed = document != self.document
        self.document = document
        self.legacy_only = result == "legacy"
        self.state = LEGACY if self.legacy_only else CURRENT
        self.attempted = True
        self.failures = 0
        self.last_error = ""
        self._count(result)
        if self._metrics is not None:
            self._metrics.last_success.labels(KUBE_APISERVER).set(started)
        if self.state != previous:
            if self.legacy_only:
                log.warning(
                    "kube-apiserver does not serve aggregated discovery; the gateway serves legacy "
                    "discovery only, as kube-apiserver does",
                )
            elif document is not None:
                log.info(
                    "kube-apiserver's discovery recovered"
                    if previous == FAILING
                    else "kube-apiserver's discovery loaded",
                    extra=fields(
                        version=self.served_version,
                        group_versions=len(document.versions),
                        after_failures=failures,
                    ),
                )
        elif changed and document is not None:
            log.debug(
                "kube-apiserver's discovery changed", extra=fields(group_versions=len(document.versions))
            )
        if changed or self.legacy_only != was_legacy:
            self._on_change()

    def _failed(self, message: str) -> None:
        self.attempted = True
        self.failures += 1
        self.last_error = message
        self._count("error")
        if self.state == FAILING:
            log.debug(
                "fetching kube-apiserver's discovery failed again",
                extra=fields(error=message, failures=self.failures),
            )
            return
        self.state = FAILING
        log.warning(
            "fetching kube-apiserver's discovery failed; serving "
            + ("its last document" if self.document is not None else "the aggregated APIServices only")
            + " and retrying",
            extra=fields(error=message),
        )

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.fetches.labels(KUBE_APISERVER, result).inc()
