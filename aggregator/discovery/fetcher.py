"""Fetches each remote APIService's discovery from its backend, so `/apis` never has to.

Per APIService (per group-version, not per Service: several APIServices behind one Service each get
their own entry, as kube-aggregator's discovery manager keys them): GET the backend's `/apis` with the aggregated Accept and the last
ETag; on a non-aggregated answer fall back to `GET /apis/<g>/<v>` and convert the APIResourceList.
Refresh every 60 s, at once when the APIService, its Service or its EndpointSlices change; failures
retry with backoff from 0.5 s to 60 s. A bounded number of fetches run at a time, each with a 5 s
timeout, as the gateway's own identity (system:kube-aggregator, system:masters), like upstream.

The backend call goes through the proxy's transport (service resolution, caBundle/SNI TLS, the
front-proxy client certificate): anything that is a `contracts.BackendFetcher`.

Fetches start once the store has synced (a Service not listed yet is not a missing Service). A
backend the availability checker found unreachable (`contracts.Reachability`) is not dialed: the
APIService goes Stale with the checker's reason, and is fetched again as soon as the checker
reaches its backend (it pokes the fetcher); meanwhile its loop is parked (a look every 10 minutes
as a backstop), so thousands of dead backends cost the fetcher nothing. Failures to reach a
backend are the checker's to report: they are logged here at debug level; a backend that answers
with something unusable is a warning, once per change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.backends.errors import BackendError
from aggregator.contracts import UNREACHABLE_RECHECK, BackendFetcher, FetchedResponse, Reachability
from aggregator.discovery.aggregated import (
    CURRENT,
    STALE,
    ConversionError,
    VersionEntry,
    convert_resource_list,
    normalize_resource,
)
from aggregator.discovery.metrics import DiscoveryMetrics
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import AGGREGATOR, AGGREGATOR_USER, UserInfo
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.util.logs import fields
from aggregator.util.loops import KeyedLoops, LoopComponent
from aggregator.util.tasks import TaskSet
from aggregator.web.metrics import Children
from aggregator.wire.negotiation import DISCOVERY_GROUP, DISCOVERY_KIND, DISCOVERY_VERSIONS
from aggregator.wire.redirects import REDIRECT_MESSAGE, is_redirect

log = logging.getLogger(__name__)

AGGREGATED_ACCEPT = ",".join(
    f"application/json;g={DISCOVERY_GROUP};v={v};as={DISCOVERY_KIND}" for v in DISCOVERY_VERSIONS
)
# Upstream's legacy fallback runs as the aggregator user without groups.
LEGACY_USER = UserInfo(AGGREGATOR_USER)


class FetchError(Exception):
    """A backend answered, but not with usable discovery."""


def is_aggregated_content_type(value: str | None) -> bool:
    """`discovery.ContentTypeIsGVK` for JSON: order-insensitive params, extra params allowed."""
    if not value:
        return False
    media, *params = value.split(";")
    if media.strip().lower() != "application/json":
        return False
    parsed = {}
    for param in params:
        key, _, val = param.partition("=")
        parsed[key.strip().lower()] = val.strip().strip('"')
    return (
        parsed.get("g") == DISCOVERY_GROUP
        and parsed.get("as") == DISCOVERY_KIND
        and parsed.get("v") in DISCOVERY_VERSIONS
    )


def _body_excerpt(body: bytes, limit: int = 512) -> str:
    return body[:limit].decode("utf-8", "replace").strip()


@dataclass(slots=True)
class FetchState:
    """What the gateway knows about one APIService's discovery."""

    apiservice: APIService
    resources: tuple[Mapping[str, Any], ...] | None = None  # the last good resources
    etag: str = ""
    fresh: bool = False  # the last attempt succeeded
    last_success: float | None = None
    last_error: str = ""
    failures: int = 0
    warned: bool = False  # the current failure was logged as a warning (so is its recovery)
    _entry: tuple[APIService, Any, str, VersionEntry] | None = field(default=None, repr=False, compare=False)

    @property
    def attempted(self) -> bool:
        """A fetch has finished, well or not (until then the gateway knows nothing of its own)."""
        return self.fresh or self.failures > 0

    def entry(self) -> VersionEntry:
        """The same object while nothing it is made of changed (renders compare by identity first)."""
        svc = self.apiservice
        freshness = CURRENT if self.fresh else STALE
        cached = self._entry
        if cached is not None and cached[0] is svc and cached[1] is self.resources and cached[2] == freshness:
            return cached[3]
        entry = VersionEntry(
            svc.group, svc.version, svc.group_priority_minimum, svc.version_priority, self.resources, freshness
        )
        self._entry = (svc, self.resources, freshness, entry)
        return entry


class DiscoveryFetcher(LoopComponent):
    """One fetch loop per remote APIService on the shared loop engine; `on_change` after every fetch."""

    def __init__(
        self,
        store: Store,
        backends: BackendFetcher,
        on_change: Callable[[], None],
        *,
        metrics: DiscoveryMetrics | None = None,
        reachability: Reachability | None = None,
        refresh_interval: float = 60.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 60.0,
        timeout: float = 5.0,
        concurrency: int = 8,
    ) -> None:
        self.store = store
        self.backends = backends
        self._on_change = on_change
        self._metrics = metrics
        self.reachability = reachability
        if metrics is not None:
            self._fetches = Children(metrics.fetches)
            self._last_success = Children(metrics.last_success)
        self.timeout = timeout
        self.states: dict[str, FetchState] = {}
        self.loops: KeyedLoops[str] = KeyedLoops(
            "discovery",
            self._fetch_named,
            interval=refresh_interval,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            concurrency=concurrency,
            delay=self._next_delay,
        )
        self._tasks = TaskSet("discovery-fetcher")
        for svc in store.apiservices():
            self._track(svc)

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """The loops run once the store has synced (at once in local mode)."""
        self.store.when_synced(self._tasks, self.loops.start, name="start")

    async def stop(self) -> None:
        await self._tasks.close()
        await self.loops.stop()

    @property
    def backstop(self) -> float:
        return 2 * self.timeout + 1

    def entries(self) -> list[VersionEntry]:
        return [state.entry() for state in self.states.values()]

    # --- store events -------------------------------------------------------------------------------

    def on_store_event(self, event: Event) -> None:
        if event.kind is Kind.APISERVICE:
            assert isinstance(event.obj, APIService)
            if event.type == DELETED:
                self._forget(event.obj.name)
            elif event.status_only:
                # A recorded verdict (ours in local mode, a status write read back in kube mode):
                # nothing discovery shows changed, so no fetch and no re-render of `/apis`.
                state = self.states.get(event.obj.name)
                if state is not None:
                    state.apiservice = event.obj
            else:
                self._track(event.obj)
            return
        for svc in self.store.affected_by(event):
            self.poke(svc.name)

    def _track(self, svc: APIService) -> None:
        if svc.local:
            self._forget(svc.name)
            return
        state = self.states.get(svc.name)
        if state is None:
            self.states[svc.name] = FetchState(svc)
            self.loops.ensure(svc.name)
        else:
            state.apiservice = svc
            self.loops.poke(svc.name)
        self._on_change()

    def _forget(self, name: str) -> None:
        state = self.states.pop(name, None)
        if state is None:
            return
        self.loops.discard(name)
        if self._metrics is not None:
            self._last_success.remove(name)
        self._on_change()

    def poke(self, name: str) -> None:
        """Refetch now (the APIService, its Service or its endpoints changed)."""
        self.loops.poke(name)

    # --- one run ------------------------------------------------------------------------------------

    def _next_delay(self, name: str, ok: bool, _failures: int) -> float | None:
        """While the checker finds the backend unreachable, or has not checked it yet: parked (its
        verdict pokes this loop; `UNREACHABLE_RECHECK` is the backstop); otherwise the engine's
        interval or backoff."""
        reachability = self.reachability
        if reachability is not None and (
            reachability.awaiting_check(name) or (not ok and reachability.unreachable(name) is not None)
        ):
            return max(self.loops.interval, UNREACHABLE_RECHECK)
        return None

    async def _fetch_named(self, name: str) -> bool:
        state = self.states.get(name)
        if state is None:
            return True
        reachability = self.reachability
        if reachability is not None and reachability.awaiting_check(name):
            return True  # the first check goes first; its verdict pokes this loop (nothing to report)
        before = state.entry()
        unreachable = reachability.unreachable(name) if reachability is not None else None
        if unreachable is not None:
            self._stale(state, f"backend unreachable: {unreachable}")  # not dialed: the checker's word
            ok = False
        else:
            ok = await self.fetch_once(state)
        if state.entry() != before:
            self._on_change()  # a steady backend (304s, the same resources) re-renders nothing
        return ok

    async def fetch_once(self, state: FetchState) -> bool:
        """One discovery attempt; updates `state` and returns whether it succeeded."""
        svc = state.apiservice
        started = time.time()
        try:
            backends = self.backends
            # Each backend call has its own timeout; this backstop covers both (aggregated + legacy).
            async with asyncio.timeout(self.backstop):
                resources, etag, result = await self._discover(backends, state)
        except (Exception, TimeoutError) as err:
            message = str(err) or type(err).__name__
            if isinstance(err, TimeoutError):
                message = f"discovery did not complete within {self.backstop:g}s"
            self._count(svc.name, "error")
            # A backend that cannot be reached is the availability checker's to report.
            self._stale(state, message, hop=getattr(err, "hop", ""), quiet=isinstance(err, BackendError))
            return False
        state.resources = resources
        state.etag = etag
        if not state.fresh and state.failures:
            (log.info if state.warned else log.debug)(
                "discovery fetch recovered", extra=fields(apiservice=svc.name, after_failures=state.failures)
            )
        state.warned = False
        state.fresh = True
        state.failures = 0
        state.last_error = ""
        state.last_success = started
        self._count(svc.name, result)
        if self._metrics is not None:
            self._last_success(svc.name).set(started)
        return True

    def _stale(self, state: FetchState, message: str, *, hop: str = "", quiet: bool = True) -> None:
        """The last good resources stay, Stale; a change of state is logged once."""
        first_failure = state.fresh or state.failures == 0
        state.fresh = False
        state.failures += 1
        state.last_error = message
        if first_failure:
            state.warned = not quiet
            (log.debug if quiet else log.warning)(
                "discovery fetch failed; "
                + (
                    "serving the last good resources as Stale"
                    if state.resources is not None
                    else "its group-version is listed as Stale, with no resources until a fetch succeeds"
                ),
                extra=fields(apiservice=state.apiservice.name, hop=hop, error=message, failures=state.failures),
            )

    def _count(self, name: str, result: str) -> None:
        if self._metrics is not None:
            self._fetches(name, result).inc()

    async def _discover(
        self, backends: BackendFetcher, state: FetchState
    ) -> tuple[tuple[Mapping[str, Any], ...], str, str]:
        svc = state.apiservice
        assert svc.service is not None
        headers = {"Accept": AGGREGATED_ACCEPT}
        if state.etag and state.resources is not None:
            headers["If-None-Match"] = state.etag
        resp = await backends.fetch(svc, "/apis", headers=headers, user=AGGREGATOR, timeout=self.timeout)
        if resp.status == 304 and state.resources is not None:
            return state.resources, state.etag, "not_modified"
        if is_redirect(resp.status):
            raise FetchError(f"GET /apis: {resp.status}: {REDIRECT_MESSAGE}")
        if resp.status == 503:
            ref = svc.service
            raise FetchError(
                f"service {ref.namespace}/{ref.name}:{ref.port} returned non-success response code: 503"
            )
        if resp.status == 200 and is_aggregated_content_type(resp.headers.get("Content-Type")):
            return self._from_aggregated(svc, resp), resp.headers.get("ETag", ""), "aggregated"
        return await self._legacy(backends, svc), "", "legacy"

    def _from_aggregated(self, svc: APIService, resp: FetchedResponse) -> tuple[Mapping[str, Any], ...]:
        try:
            doc = json.loads(resp.body)
        except (ValueError, UnicodeDecodeError) as err:
            raise FetchError(f"invalid aggregated discovery document from the backend: {err}") from err
        items = doc.get("items") if isinstance(doc, dict) else None
        for item in items if isinstance(items, list) else []:
            metadata = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(metadata, dict) or metadata.get("name", "") != svc.group:
                continue
            for version in item.get("versions") or []:
                if isinstance(version, dict) and version.get("version") == svc.version:
                    resources = version.get("resources") or []
                    return tuple(normalize_resource(r) for r in resources if isinstance(r, dict))
        # The backend does not serve this group-version: listed, Current, without resources (as upstream).
        return ()

    async def _legacy(self, backends: BackendFetcher, svc: APIService) -> tuple[Mapping[str, Any], ...]:
        path = f"/apis/{svc.group}/{svc.version}" if svc.group else f"/api/{svc.version}"
        resp = await backends.fetch(
            svc, path, headers={"Accept": "application/json"}, user=LEGACY_USER, timeout=self.timeout
        )
        if is_redirect(resp.status):
            raise FetchError(f"GET {path}: {resp.status}: {REDIRECT_MESSAGE}")
        if resp.status != 200:
            raise FetchError(f"failed to download legacy discovery for {path}: {_body_excerpt(resp.body)}")
        try:
            doc = json.loads(resp.body)
            resources = doc.get("resources") or [] if isinstance(doc, dict) else []
            return tuple(convert_resource_list([r for r in resources if isinstance(r, dict)]))
        except ConversionError as err:
            raise FetchError(str(err)) from err
        except (ValueError, UnicodeDecodeError) as err:
            raise FetchError(f"invalid APIResourceList from {path}: {err}") from err
