"""A worker's copy of what the control process knows, fed over its channel.

It answers the request path through the same narrow interfaces the control's components do:
`contracts.Availability` and `contracts.Recheck` (the proxy), the aggregated `/apis` endpoint
(`discovery/routes.py` `AggregatedEndpoint`), the published OpenAPI documents
(`openapi/routes.py` `PublishedOpenAPI`), and the control's health checks by name. Its store is a
real `Store`, replaying the control's events with the control's revisions, so routes, address
resolution, legacy discovery and `apiregistration.k8s.io` work locally exactly as in one process.

Everything received is held here first, and whatever is bound later (the worker's gateway is built
after the first snapshot arrived) starts from what is held: no state in the snapshot waits for a
change to reach the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from aggregator.auth.authconfigmap import AuthConfigMap, ClusterAuthentication
from aggregator.auth.modes import PolicyHolder
from aggregator.discovery.aggregated import HEADERS as AGGREGATED_HEADERS
from aggregator.discovery.routes import DiscoveryRoutes
from aggregator.model.apiservice import Condition
from aggregator.openapi.component import EMPTY_V3, V2Input, V2Published, V3Published, base_document, build_v2
from aggregator.openapi.documents import Document
from aggregator.sources.store import Store
from aggregator.util.logs import fields
from aggregator.web.rendering import respond
from aggregator.wire.negotiation import DISCOVERY_GROUP, DISCOVERY_KIND, MediaType
from aggregator.wire.rendered import Rendered
from aggregator.workers import metrics as merging
from aggregator.workers.channel import Channel
from aggregator.workers.messages import (
    AggregatedDocs,
    AuditLines,
    Collect,
    Collected,
    Ejection,
    Hello,
    ObjectChange,
    Scrape,
    Scraped,
    State,
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


_UNPARSED: dict[str, Any] = {}


class _Received(Rendered):
    """A document rendered by the control: the compact JSON and ETag as received; the parsed
    document (for the indented JSON and YAML forms only) is built on first use, so a worker does
    not hold a second, dict-shaped copy of a large `/apis` nobody asks for in those forms."""

    __slots__ = ()

    def _parse(self) -> None:
        if self._document is _UNPARSED:
            self._document = json.loads(self.json)

    @property
    def pretty(self) -> bytes:
        self._parse()
        return Rendered.pretty.fget(self)  # type: ignore[attr-defined,no-any-return]

    @property
    def yaml(self) -> bytes:
        self._parse()
        return Rendered.yaml.fget(self)  # type: ignore[attr-defined,no-any-return]


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
        self, channel: Channel, hello: Hello, *, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self.channel = channel
        self.hello = hello
        self.store = Store()
        self._timer = timer
        self._verdicts: dict[str, VerdictView] = {}
        self._health: dict[str, str | None] = {}
        self._notes: dict[str, list[str]] = {}
        self._aggregated: dict[str, Rendered] = {}
        self._legacy_only = False
        self._routes: DiscoveryRoutes | None = None
        self._v2: V2Published = build_v2([V2Input("gateway", base_document())])
        self._v3: V3Published = EMPTY_V3
        self._cluster: AuthConfigMap | None = None
        self._cluster_auth: ClusterAuthentication | None = None
        # Local mode: the control's RBAC policy (the snapshot carries it, before anything is built).
        self.rbac = PolicyHolder()
        self._collect: Callable[[], list[Metric]] = list
        self._suspected: dict[str, float] = {}
        self._scrapes: dict[int, asyncio.Future[list[Metric]]] = {}
        self._ids = itertools.count(1)
        self.connected = True
        self.first_state = asyncio.Event()
        # Features that talk with the control over the channel (APF's seat shares): each is offered
        # the messages that are not the replica's and returns True for its own.
        self._handlers: list[Callable[[object], bool]] = []

    # --- wiring (assembly) -------------------------------------------------------------------------

    def bind_discovery(self, routes: DiscoveryRoutes) -> None:
        """The routes whose `/apis` goes legacy-only when the control's does."""
        self._routes = routes
        routes.aggregated = None if self._legacy_only or not self._aggregated else self

    def bind_cluster_auth(self, cluster: AuthConfigMap | None) -> None:
        """Where the control's copy of the cluster's authentication ConfigMap goes (kube mode); it
        takes the copy held now at once."""
        self._cluster = cluster
        if cluster is not None and self._cluster_auth is not None:
            cluster.use(self._cluster_auth)

    def bind_metrics(self, collect: Callable[[], list[Metric]]) -> None:
        self._collect = collect

    def bind_handler(self, handler: Callable[[object], bool]) -> None:
        """A feature's messages from the control process (it returns True for those it takes)."""
        self._handlers.append(handler)

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
        elif isinstance(message, State):
            self._apply_state(message)
        elif isinstance(message, Collect):
            self.channel.send(Collected(message.id, self._collect()))
        elif isinstance(message, Scraped):
            future = self._scrapes.get(message.id)
            if future is not None and not future.done():
                future.set_result(message.families)
        else:
            for handler in self._handlers:
                if handler(message):
                    break

    def _apply_object(self, change: ObjectChange) -> None:
        store = self.store
        store.revision = change.revision - 1  # the event takes the control's revision
        if change.obj is None:
            store.delete(change.kind, change.namespace, change.name)
        else:
            store.upsert(change.obj)
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
        if state.health is not None:
            self._health = state.health
        if state.notes is not None:
            self._notes = state.notes
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
            self._cluster_auth = state.cluster_auth
            if self._cluster is not None:
                self._cluster.use(state.cluster_auth)
        if state.rbac is not None:
            self.rbac.use(state.rbac)
        self.first_state.set()

    def _apply_discovery(self, docs: AggregatedDocs) -> None:
        self._aggregated = {
            version: _Received(_UNPARSED, body, etag) for version, body, etag in docs.documents
        }
        self._legacy_only = docs.legacy_only
        if self._routes is not None:
            self._routes.aggregated = None if docs.legacy_only else self

    # --- contracts.Availability, contracts.Recheck -------------------------------------------------

    def is_available(self, name: str) -> bool:
        """The control's latest verdict; before the first one, the object's own condition."""
        view = self._verdicts.get(name)
        if view is not None:
            return view[0]
        svc = self.store.apiservice(name)
        return svc is not None and _available(svc.conditions)

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

    def serve(self, request: web.Request, media: MediaType) -> web.StreamResponse:
        """`/apis` in the aggregated form, from the control's rendering (`AggregatedDiscovery.serve`)."""
        version = media.aggregated_version or "v2"
        content_type = f"{media.media_type};g={DISCOVERY_GROUP};v={version};as={DISCOVERY_KIND}"
        return respond(
            request, self._aggregated[version], media, content_type=content_type, headers=AGGREGATED_HEADERS
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
            return [*self._notes.get(endpoint, []), own]

        return lines

    # --- metrics -----------------------------------------------------------------------------------

    async def serve_metrics(self, request: web.Request) -> web.Response:
        """`/metrics` for the whole process group (`metrics.py`), or this worker's alone without
        the control (logged)."""
        families = await self._group_metrics()
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(merging.Merged(families)), headers={"Content-Type": content_type})

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
