"""The control process's side of the channels: one snapshot per worker, then what changes.

Workers receive changes, never snapshots of everything again, and nothing here walks every
APIService on a timer:
- store events go out as they happen (in order, each with the control's revision), so every
  worker resolves addresses and routes from the same objects;
- a changed verdict and a changed `/readyz?verbose` line (the checker's `NoteBoard`) are heard
  from their owners and go out at the next turn of the event loop, batched, and before any store
  event that follows them (a flip reaches every worker before the status write it causes);
- what has no change signal of its own is compared every `interval` (100 ms), each in O(1):
  the health checks' results, notes from sources that give whole lists (the Lease holder's), the
  aggregated discovery document and the OpenAPI documents (immutable once rendered: a new render
  is a new object, compared by identity; never rendered here: their own throttles decide when),
  the requestheader configuration read from the cluster's ConfigMap, local mode's RBAC policy and
  the APIServices in discovery quarantine.
Each message is pickled once for every worker. Nothing here probes or fetches: workers never
cause background traffic of their own.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from prometheus_client.core import Metric

from aggregator.audit.recorder import EventWriter
from aggregator.auth.authconfigmap import CHECK_NAME as CLUSTER_AUTH_CHECK
from aggregator.auth.authconfigmap import AuthConfigMap, ClusterAuthentication
from aggregator.auth.modes import PolicySource
from aggregator.auth.rbac import RBACPolicy
from aggregator.availability.checker import AvailabilityChecker
from aggregator.contracts import Quarantined
from aggregator.discovery.component import Discovery
from aggregator.model.apiservice import APIService
from aggregator.openapi.component import OpenAPIAggregation, V2Published
from aggregator.openapi.documents import Document
from aggregator.sources.store import DELETED, Event, Kind, Store, key_of
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet
from aggregator.web.health import ENDPOINTS, HealthChecks, NoteBoard, Notes
from aggregator.web.health import NoteKey as BoardKey
from aggregator.wire.rendered import Rendered
from aggregator.workers import metrics as merging
from aggregator.workers.channel import Channel, encode
from aggregator.workers.messages import (
    AggregatedDocs,
    AuditLines,
    Collect,
    Collected,
    Ejection,
    HealthCheck,
    NoteKey,
    ObjectChange,
    Scrape,
    Scraped,
    State,
    StatusChange,
    Suspect,
    VerdictView,
)

log = logging.getLogger(__name__)

INTERVAL = 0.1
# How long a scrape waits for each worker's figures; a worker that does not answer is left out.
# Well inside Prometheus's default scrape_timeout (10 s): a worker busy on a loaded node answers
# within a few seconds, and a scrape that silently lacks its series looks like a dead worker.
COLLECT_TIMEOUT = 5.0
# Checks every worker answers itself: its own liveness and shutdown, and whether it holds the
# cluster's authentication settings (its copy, not the control's).
LOCAL_CHECKS = frozenset({"ping", "shutdown", CLUSTER_AUTH_CHECK})


@dataclass
class _Published:
    """What the workers were told (or are about to be: `Publisher._pending`), kept up to date as
    changes come in; a new worker's snapshot is built from it."""

    verdicts: dict[str, VerdictView] = field(default_factory=dict)
    health: dict[str, str | None] = field(default_factory=dict)
    notes: dict[str, dict[NoteKey, str]] = field(default_factory=lambda: {e: {} for e in ENDPOINTS})
    # Whole lists last read from each polled note source: (endpoint, position) -> lines.
    polled_notes: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    discovery: AggregatedDocs | None = None
    discovery_sources: tuple[object, ...] = ()
    openapi_v2: V2Published | None = None
    openapi_v3_index: Document | None = None
    openapi_v3: dict[str, Document] = field(default_factory=dict)
    cluster_auth: ClusterAuthentication | None = None
    rbac: RBACPolicy | None = None
    quarantined: frozenset[str] = frozenset()
    synced: bool = False


def message_for(event: Event) -> ObjectChange | StatusChange:
    """The message for a store event: only the new conditions when that is all that changed on an
    object the control already sent (our own status write keeps the manifest it had)."""
    new, old = event.obj, event.old
    if (
        event.status_only
        and event.type != DELETED
        and isinstance(new, APIService)
        and isinstance(old, APIService)
        and new.raw is old.raw
        and replace(old, conditions=new.conditions, resource_version=new.resource_version) == new
    ):
        return StatusChange(new.name, new.conditions, new.resource_version, event.revision)
    namespace, name = key_of(new)
    return ObjectChange(event.kind, None if event.type == DELETED else new, namespace, name, event.revision)


class Publisher:
    """Feeds every connected worker from the control gateway's components."""

    def __init__(
        self,
        *,
        store: Store,
        availability: AvailabilityChecker,
        health: HealthChecks,
        discovery: Discovery,
        openapi: OpenAPIAggregation,
        cluster_auth: AuthConfigMap | None,
        collectors: Callable[[], list[Metric]],
        audit: EventWriter | None = None,
        rbac: PolicySource | None = None,
        quarantine: Quarantined | None = None,
        interval: float = INTERVAL,
    ) -> None:
        # The APIServices left out of discovery: workers render legacy `/apis` themselves.
        self.quarantine = quarantine
        # The one writer of the audit log: workers send their encoded events here.
        self.audit = audit
        self.store = store
        self.availability = availability
        self.health = health
        self.discovery = discovery
        self.openapi = openapi
        self.cluster_auth = cluster_auth
        # Local mode: the RBAC policy workers authorize with (never derived in a worker, so a
        # worker started after a bad edit holds the same last good rules as its siblings).
        self.rbac = rbac
        self.collectors = collectors
        self.interval = interval
        self._channels: dict[int, Channel] = {}
        self._published = _Published()
        # What changed and is not sent yet (sent at the next turn of the loop, or before the next
        # store event, whichever comes first).
        self._pending = State()
        self._dirty = False
        self._flush_soon: asyncio.Handle | None = None
        # Note sources that give whole lists, read every interval: (endpoint, position, source).
        self._polled: list[tuple[str, int, Notes]] = []
        self._ids = itertools.count(1)
        # Intervals polled so far (tests wait on it).
        self.ticks = 0
        # Scrapes waiting for a worker's figures: collect id -> (worker index, its answer).
        self._collecting: dict[int, tuple[int, asyncio.Future[list[Metric]]]] = {}
        self._tasks = TaskSet("publisher")
        store.add_listener(self._on_event)
        # A changed verdict goes out before the status write it causes (the store event): a worker
        # never routes by a verdict older than the condition it shows.
        availability.add_verdict_listener(self._on_verdict)
        self._follow_notes()

    def checks(self) -> tuple[HealthCheck, ...]:
        """The control's health checks each worker mirrors by name."""
        livez = {c.name for c in self.health.checks_for("livez")}
        readyz = {c.name for c in self.health.checks_for("readyz")}
        return tuple(
            HealthCheck(c.name, c.name in livez, c.name in readyz)
            for c in self.health.checks_for("healthz")
            if c.name not in LOCAL_CHECKS
        )

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        # The first snapshot carries the current state: verdicts found before now, then every poll.
        for name, verdict in self.availability.verdicts():
            self._published.verdicts[name] = (verdict.available, verdict.reason)
        self._poll()
        self._clear_pending()
        self._tasks.spawn(self._tick(), name="tick")

    async def stop(self) -> None:
        await self._tasks.close()
        if self._flush_soon is not None:
            self._flush_soon.cancel()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self._poll()
            self.flush()
            self.ticks += 1

    # --- one worker --------------------------------------------------------------------------------

    async def serve(
        self, index: int, channel: Channel, *, on: Callable[[object], bool] | None = None
    ) -> None:
        """Send the snapshot, then answer the worker until its channel closes; `on` sees the
        messages that are not the publisher's (it returns True for those it took)."""
        self.flush()  # the others get what the snapshot holds, so all go on from the same state
        channel.send(self._snapshot())
        self._channels[index] = channel
        try:
            while True:
                message = await channel.receive()
                if on is None or not on(message):
                    self._handle(index, channel, message)
        except EOFError:
            pass
        finally:
            if self._channels.get(index) is channel:
                del self._channels[index]
            channel.close()
            if self.availability.ejections is not None:
                self.availability.ejections.forget_source(str(index))
            for worker, future in self._collecting.values():
                if worker == index and not future.done():
                    future.cancel()  # a scrape does not wait for a worker that died

    def _handle(self, index: int, channel: Channel, message: object) -> None:
        if isinstance(message, Suspect):
            self.availability.suspect(message.name)
        elif isinstance(message, Ejection):
            if self.availability.ejections is not None:
                self.availability.ejections.ejection(
                    message.name, message.endpoint, message.reason, str(index)
                )
        elif isinstance(message, AuditLines):
            if self.audit is not None:
                self.audit.submit(message.data)
        elif isinstance(message, Collected):
            waiting = self._collecting.get(message.id)
            if waiting is not None and not waiting[1].done():
                waiting[1].set_result(message.families)
        elif isinstance(message, Scrape):
            self._tasks.spawn(self._answer_scrape(channel, message.id), name=f"scrape-{index}")
        else:
            log.warning(
                "unexpected message from a worker", extra=fields(worker=index, type=type(message).__name__)
            )

    async def _answer_scrape(self, channel: Channel, scrape: int) -> None:
        channel.send(Scraped(scrape, await self.group_metrics()))

    async def group_metrics(self) -> list[Metric]:
        """Every process's families, merged (`metrics.py`)."""
        waits: list[tuple[int, int, asyncio.Future[list[Metric]]]] = []
        loop = asyncio.get_running_loop()
        for index, channel in sorted(self._channels.items()):
            collect = next(self._ids)
            future: asyncio.Future[list[Metric]] = loop.create_future()
            self._collecting[collect] = (index, future)
            channel.send(Collect(collect))
            waits.append((index, collect, future))
        sources: list[tuple[str, list[Metric]]] = [(merging.CONTROL, self.collectors())]
        try:
            if waits:
                await asyncio.wait([f for _, _, f in waits], timeout=COLLECT_TIMEOUT)
            for index, _, future in waits:
                if future.done() and not future.cancelled():
                    sources.append((str(index), future.result()))
                else:
                    log.warning("a worker sent no metrics in time", extra=fields(worker=index))
        finally:
            for _, collect, future in waits:
                self._collecting.pop(collect, None)
                future.cancel()
        return merging.merge(sources)

    # --- what changed ------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if not self._channels:
            return
        self.flush()  # verdicts first: the status write that follows a verdict comes after it
        self._send(message_for(event))

    def _on_verdict(self, name: str) -> None:
        verdict = self.availability.verdict(name)
        p = self._published
        if verdict is None:
            if p.verdicts.pop(name, None) is None:
                return
            self._pending.verdicts[name] = None
        else:
            view = (verdict.available, verdict.reason)
            if p.verdicts.get(name) == view:
                return
            p.verdicts[name] = self._pending.verdicts[name] = view
        self._changed()

    def _follow_notes(self) -> None:
        """Listen to every `NoteBoard` among the control's note sources; poll the others."""
        for endpoint in ENDPOINTS:
            for position, source in enumerate(self.health.note_sources(endpoint)):
                if isinstance(source, NoteBoard):
                    for key, line in source.items().items():
                        self._published.notes[endpoint][(position, *key)] = line
                    source.add_listener(functools.partial(self._on_note, endpoint, position))
                else:
                    self._polled.append((endpoint, position, source))

    def _on_note(self, endpoint: str, position: int, key: BoardKey, line: str | None) -> None:
        self._set_note(endpoint, (position, *key), line)
        self._changed()

    def _set_note(self, endpoint: str, key: NoteKey, line: str | None) -> None:
        held = self._published.notes[endpoint]
        if line is None:
            held.pop(key, None)
        else:
            held[key] = line
        self._pending.notes.setdefault(endpoint, {})[key] = line

    def _changed(self) -> None:
        """Something is pending: send it at the next turn of the loop (batching a burst)."""
        self._dirty = True
        if self._flush_soon is None and self._channels:
            self._flush_soon = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send what is pending to every worker, as one `State`."""
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        if not self._dirty:
            return
        state = self._pending
        state.synced = self._published.synced
        self._clear_pending()
        self._send(state)

    def _clear_pending(self) -> None:
        self._pending = State()
        self._dirty = False

    def _send(self, message: object) -> None:
        if not self._channels:
            return
        frame = encode(message)  # once, whatever the number of workers
        for channel in self._channels.values():
            channel.send_frame(frame)

    def _snapshot(self) -> State:
        p = self._published
        objects = [obj for kind in Kind for obj in self.store.objects(kind)]
        return State(
            snapshot=True,
            objects=objects,
            revision=self.store.revision,
            synced=p.synced,
            verdicts=dict(p.verdicts),
            health=dict(p.health),
            notes={endpoint: dict(lines) for endpoint, lines in p.notes.items()},
            discovery=p.discovery,
            openapi_v2=p.openapi_v2,
            openapi_v3_index=p.openapi_v3_index,
            openapi_v3=dict(p.openapi_v3),
            cluster_auth=p.cluster_auth,
            rbac=p.rbac,
            quarantined=p.quarantined,
        )

    def _poll(self) -> None:
        """Compare what has no change signal with what was published, each in O(1) unless it
        changed; the differences join the pending `State`."""
        p, state = self._published, self._pending
        if self.store.synced != p.synced:
            p.synced = True
            self._dirty = True
        health = self._health()
        if health != p.health:
            p.health = state.health = health
            self._dirty = True
        for endpoint, position, source in self._polled:
            self._poll_notes(endpoint, position, source)
        discovery = self._discovery()
        if discovery is not None:
            p.discovery = state.discovery = discovery
            self._dirty = True
        openapi = self.openapi
        if openapi.v2 is not p.openapi_v2:
            p.openapi_v2 = state.openapi_v2 = openapi.v2
            self._dirty = True
        v3 = openapi.v3_if_published()
        if v3 is not None and v3.index is not p.openapi_v3_index:
            p.openapi_v3_index = state.openapi_v3_index = v3.index
            self._dirty = True
            # A new index means a document was added, removed or changed; `v3.documents` is then a
            # new mapping, compared by identity here (once per re-render, not per interval).
            self._diff_v3(v3.documents)
        cluster = self.cluster_auth.current if self.cluster_auth is not None else None
        if cluster is not p.cluster_auth:
            p.cluster_auth = state.cluster_auth = cluster
            self._dirty = True
        rbac = self.rbac.current if self.rbac is not None else None
        if rbac is not p.rbac:
            p.rbac = state.rbac = rbac
            self._dirty = True
        quarantined = self.quarantine.quarantined if self.quarantine is not None else p.quarantined
        if quarantined is not p.quarantined:  # replaced, never mutated, on every change
            p.quarantined = state.quarantined = quarantined
            self._dirty = True

    def _poll_notes(self, endpoint: str, position: int, source: Notes) -> None:
        try:
            lines = source()
        except Exception as err:  # a broken source shows as a line, as nowhere else would
            lines = [f"warn: notes failed: {type(err).__name__}: {err}"]
        previous = self._published.polled_notes.get((endpoint, position), [])
        if lines == previous:
            return
        self._published.polled_notes[endpoint, position] = lines
        for index in range(len(lines), len(previous)):
            self._set_note(endpoint, (position, index, ""), None)
        for index, line in enumerate(lines):
            if index >= len(previous) or previous[index] != line:
                self._set_note(endpoint, (position, index, ""), line)
        self._dirty = True

    def _diff_v3(self, documents: Mapping[str, Document]) -> None:
        p, state = self._published, self._pending
        for key in p.openapi_v3.keys() - documents.keys():
            state.openapi_v3[key] = None
        for key, document in documents.items():
            if p.openapi_v3.get(key) is not document:
                state.openapi_v3[key] = document
        p.openapi_v3 = dict(documents)

    def _health(self) -> dict[str, str | None]:
        results: dict[str, str | None] = {}
        for check in self.health.checks_for("healthz"):
            if check.name in LOCAL_CHECKS:
                continue
            try:
                results[check.name] = check.check()
            except Exception as err:  # a broken check fails, as the endpoint would report it
                results[check.name] = f"check raised {type(err).__name__}: {err}"
        return results

    def _discovery(self) -> AggregatedDocs | None:
        """The aggregated document when it was re-rendered (or `/apis` went legacy-only)."""
        legacy_only = self.discovery.legacy_only
        aggregated = self.discovery.aggregated
        rendered: list[tuple[str, Rendered]] = []
        for version in ("v2", "v2beta1"):
            document = aggregated.document_if_rendered(version)
            if document is None:
                return None  # its throttled render comes soon: the next interval sends it
            rendered.append((version, document))
        sources: tuple[object, ...] = (legacy_only, *(r for _, r in rendered))
        p = self._published
        if len(sources) == len(p.discovery_sources) and all(
            a is b for a, b in zip(sources, p.discovery_sources, strict=True)
        ):
            return None
        p.discovery_sources = sources
        return AggregatedDocs(legacy_only, tuple((v, r.json, r.etag) for v, r in rendered))


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def families(registries: Iterable[Collector]) -> list[Metric]:
    """Every family of these registries, in order."""
    return [metric for registry in registries for metric in registry.collect()]
