"""A worker's copy of what the control process knows, fed over its channel.

It answers the request path through the same narrow interfaces the control's components do:
`contracts.Availability` and `contracts.Recheck` (the proxy), the aggregated `/apis` endpoint
(`discovery/routes.py` `AggregatedEndpoint`), the published OpenAPI documents
(`openapi/routes.py` `PublishedOpenAPI`), and the control's health checks by name. Its store is a
real `Store`, replaying the control's events with the control's revisions, so routes, address
resolution, legacy discovery and `apiregistration.k8s.io` work locally exactly as in one process.

The worker's gateway is built after the first snapshot arrived, from this object: what it follows
(verdicts, the quarantine, the cluster's authentication ConfigMap, local mode's RBAC policy) it reads
from what is held, then hears of each change; nothing is bound to it afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from aggregator.auth.authconfigmap import ClusterAuthentication
from aggregator.auth.modes import PolicyHolder
from aggregator.discovery.aggregated import HEADERS as AGGREGATED_HEADERS
from aggregator.model.apiservice import Condition
from aggregator.openapi.component import EMPTY_V3, V2Input, V2Published, V3Published, base_document, build_v2
from aggregator.openapi.documents import Document
from aggregator.sources.store import Store
from aggregator.util.latest import Latest
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.rendering import respond
from aggregator.web.serverrequest import Response
from aggregator.wire.negotiation import DISCOVERY_GROUP, DISCOVERY_KIND, MediaType
from aggregator.wire.rendered import ParsedLater, Rendered
from aggregator.workers import metrics as merging
from aggregator.workers.channel import Channel
from aggregator.workers.messages import (
    AggregatedDocs,
    AuditLines,
    Collect,
    Collected,
    Ejection,
    Hello,
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

# At most one re-check request per APIService per this many seconds goes to the control (which
# rate-limits again, to one check a second, planning the next one at the window's end).
SUSPECT_INTERVAL = 0.1
# How long `/metrics` waits for the group's figures before answering with this worker's alone.
SCRAPE_TIMEOUT = 5.0
CHANNEL_CHECK = "control-process"


def _available(conditions: tuple[Condition, ...]) -> bool:
    return any(c.type == "Available" and c.status == "True" for c in conditions)


class AuditLinesSink:
    """A `LineSink` for the audit writer's thread: each line goes to the control over the channel
    (sent from the event loop, where the channel lives)."""

    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop) -> None:
        self._channel = channel
        self._loop = loop

    def write(self, data: bytes) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._channel.send, AuditLines(data))

    def close(self) -> None:
        """The channel is the worker's; it closes with it."""


class Replica:
    """State received from the control; `run()` applies it until the channel closes."""

    def __init__(
        self,
        channel: Channel,
        hello: Hello,
        *,
        collect: Callable[[], list[Metric]],
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`collect`: this worker's own metric families (its gateway's registry), for scrapes."""
        self.channel = channel
        self.hello = hello
        self.store = Store()
        self._timer = timer
        self._verdicts: dict[str, VerdictView] = {}
        self._verdict_listeners: list[Callable[[str], None]] = []
        self._health: dict[str, str | None] = {}
        # The control's verbose lines per endpoint, by key, and in key order once asked for.
        self._notes: dict[str, dict[NoteKey, str]] = {}
        self._ordered_notes: dict[str, list[str]] = {}
        self._aggregated: dict[str, Rendered] = {}
        self._legacy_only = False
        # `contracts.Quarantined`: the control's book, for this worker's legacy `/apis`.
        self.quarantined: frozenset[str] = frozenset()
        self._quarantine_listeners: list[Callable[[str], None]] = []
        self._v2: V2Published = build_v2([V2Input("gateway", base_document())])
        self._v3: V3Published = EMPTY_V3
        # Kube mode: the control's copies of the cluster's authentication ConfigMap.
        self.cluster_auth: Latest[ClusterAuthentication] = Latest()
        # Local mode: the control's RBAC policy (the snapshot carries it, before anything is built).
        self.rbac = PolicyHolder()
        self._collect = collect
        self._suspected: dict[str, float] = {}
        self._scrapes: dict[int, asyncio.Future[list[Metric]]] = {}
        self._ids = itertools.count(1)
        self.connected = True
        self.first_state = asyncio.Event()
        # Features that talk with the control over the channel (APF's seat shares): each is offered
        # the messages that are not the replica's and returns True for its own.
        self._message_handlers: list[Callable[[object], bool]] = []

    # --- the channel -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Apply messages until the control goes away (then readiness fails and `run` returns)."""
        try:
            while True:
                self.apply(await self.channel.receive())
        except EOFError:
            log.error("the control process closed the channel", extra=fields(worker=self.hello.index))
        finally:
            self.connected = False
            for future in self._scrapes.values():
                if not future.done():
                    future.set_exception(EOFError("the control process is gone"))

    def apply(self, message: object) -> None:
        if isinstance(message, ObjectChange):
            self._apply_object(message)
        elif isinstance(message, StatusChange):
            self._apply_status(message)
        elif isinstance(message, State):
            self._apply_state(message)
        elif isinstance(message, Collect):
            self.channel.send(Collected(message.id, self._collect()))
        elif isinstance(message, Scraped):
            future = self._scrapes.get(message.id)
            if future is not None and not future.done():
                future.set_result(message.families)
        else:
            for handler in self._message_handlers:
                if handler(message):
                    break

    def add_message_handler(self, handler: Callable[[object], bool]) -> None:
        """A feature's messages from the control process (it returns True for those it takes)."""
        self._message_handlers.append(handler)

    def _apply_object(self, change: ObjectChange) -> None:
        store = self.store
        store.revision = change.revision - 1  # the event takes the control's revision
        if change.obj is None:
            store.delete(change.kind, change.namespace, change.name)
        else:
            store.upsert(change.obj)
        store.revision = change.revision

    def _apply_status(self, change: StatusChange) -> None:
        store = self.store
        current = store.apiservice(change.name)
        if current is None:  # cannot happen: the control sent the object before its status
            log.error(
                "a status change for an APIService this worker does not hold",
                extra=fields(apiservice=change.name),
            )
            return
        store.revision = change.revision - 1
        store.upsert(replace(current, conditions=change.conditions, resource_version=change.resource_version))
        store.revision = change.revision

    def _apply_state(self, state: State) -> None:
        if state.snapshot:
            # A new snapshot (the first) holds every object; the store starts empty.
            store = self.store
            for obj in state.objects:
                store.upsert(obj)
            store.revision = state.revision
        if state.synced:
            self.store.mark_synced()
        for name, view in state.verdicts.items():
            if view is None:
                self._verdicts.pop(name, None)
            else:
                self._verdicts[name] = view
            for listener in self._verdict_listeners:
                listener(name)
        if state.health is not None:
            self._health = state.health
        for endpoint, lines in state.notes.items():
            held = self._notes.setdefault(endpoint, {})
            for note, line in lines.items():
                if line is None:
                    held.pop(note, None)
                else:
                    held[note] = line
            self._ordered_notes.pop(endpoint, None)
        if state.discovery is not None:
            self._apply_discovery(state.discovery)
        if state.openapi_v2 is not None:
            self._v2 = state.openapi_v2
        if state.openapi_v3_index is not None or state.openapi_v3:
            documents: dict[str, Document] = dict(self._v3.documents)
            for key, document in state.openapi_v3.items():
                if document is None:
                    documents.pop(key, None)
                else:
                    documents[key] = document
            self._v3 = V3Published(state.openapi_v3_index or self._v3.index, documents)
        if state.cluster_auth is not None:
            self.cluster_auth.publish(state.cluster_auth)
        if state.rbac is not None:
            self.rbac.use(state.rbac)
        if state.quarantined is not None and state.quarantined != self.quarantined:
            changed = state.quarantined ^ self.quarantined
            self.quarantined = state.quarantined
            for name in changed:
                for listener in self._quarantine_listeners:
                    listener(name)
        self.first_state.set()

    def _apply_discovery(self, docs: AggregatedDocs) -> None:
        self._aggregated = {version: ParsedLater(body, etag) for version, body, etag in docs.documents}
        self._legacy_only = docs.legacy_only

    # --- contracts.Availability, contracts.Recheck -------------------------------------------------

    def is_available(self, name: str) -> bool:
        """The control's latest verdict; before the first one, the object's own condition."""
        view = self._verdicts.get(name)
        if view is not None:
            return view[0]
        svc = self.store.apiservice(name)
        return svc is not None and _available(svc.conditions)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Told of every APIService whose verdict the control sent."""
        self._verdict_listeners.append(listener)

    def add_quarantine_listener(self, listener: Callable[[str], None]) -> None:
        """Told of every APIService that entered or left discovery quarantine."""
        self._quarantine_listeners.append(listener)

    def reason(self, name: str) -> str:
        view = self._verdicts.get(name)
        if view is not None:
            return view[1]
        svc = self.store.apiservice(name)
        if svc is None:
            return ""
        condition = next((c for c in svc.conditions if c.type == "Available"), None)
        return condition.reason if condition is not None else ""

    def ejection(self, name: str, endpoint: str, reason: str) -> None:
        """`contracts.EjectionReport`: the control names the endpoints any worker holds ejected."""
        self.channel.send(Ejection(name, endpoint, reason))

    def suspect(self, name: str) -> None:
        """A proxied request failed: the control re-checks it (the fast re-probe, as a message)."""
        now = self._timer()
        last = self._suspected.get(name)
        if last is not None and now - last < SUSPECT_INTERVAL:
            return
        self._suspected[name] = now
        self.channel.send(Suspect(name))

    def audit_sink(self) -> AuditLinesSink:
        """Where this worker's audit writer puts its encoded events: the control process, whose one
        writer owns the log file and its rotation (call from the event loop)."""
        return AuditLinesSink(self.channel, asyncio.get_running_loop())

    # --- discovery and OpenAPI ---------------------------------------------------------------------

    def serve_aggregated(self, ctx: RequestContext, media: MediaType) -> Response | None:
        """`/apis` in the aggregated form, from the control's rendering (`AggregatedDiscovery.serve`);
        None while the control's `/apis` is legacy only (`discovery/routes.py` `AggregatedEndpoint`)."""
        if self._legacy_only or not self._aggregated:
            return None
        version = media.aggregated_version or "v2"
        content_type = f"{media.media_type};g={DISCOVERY_GROUP};v={version};as={DISCOVERY_KIND}"
        return respond(
            ctx, self._aggregated[version], media, content_type=content_type, headers=AGGREGATED_HEADERS
        )

    @property
    def v2(self) -> V2Published:
        return self._v2

    @property
    def v3(self) -> V3Published:
        return self._v3

    # --- health ------------------------------------------------------------------------------------

    def check(self, name: str) -> Callable[[], str | None]:
        """The control's check `name`, as it last reported it."""

        def run() -> str | None:
            if name not in self._health:
                return "not reported by the control process yet"
            return self._health[name]

        return run

    def channel_check(self) -> str | None:
        """readyz `control-process`: this worker still hears from the control."""
        return None if self.connected else "the channel to the control process is closed"

    def notes(self, endpoint: str) -> Callable[[], list[str]]:
        def lines() -> list[str]:
            own = f"info: worker {self.hello.index} of {self.hello.count}, pid {os.getpid()}"
            ordered = self._ordered_notes.get(endpoint)
            if ordered is None:
                held = self._notes.get(endpoint, {})
                ordered = self._ordered_notes[endpoint] = [held[key] for key in sorted(held)]
            return [*ordered, own]

        return lines

    # --- metrics -----------------------------------------------------------------------------------

    async def serve_metrics(self, ctx: RequestContext) -> Response:
        """`/metrics` for the whole process group (`metrics.py`), or this worker's alone without
        the control (logged)."""
        families = await self._group_metrics()
        encoder, content_type = choose_encoder(ctx.headers.get("Accept", ""))
        return Response(200, encoder(merging.Merged(families)), content_type=content_type)

    async def _group_metrics(self) -> list[Metric]:
        if self.connected:
            scrape = next(self._ids)
            future: asyncio.Future[list[Metric]] = asyncio.get_running_loop().create_future()
            self._scrapes[scrape] = future
            self.channel.send(Scrape(scrape))
            try:
                async with asyncio.timeout(SCRAPE_TIMEOUT):
                    return await future
            except (TimeoutError, EOFError):
                pass
            finally:
                self._scrapes.pop(scrape, None)
        log.warning("metrics of this worker alone: no answer from the control process")
        return merging.merge([(str(self.hello.index), self._collect())])
