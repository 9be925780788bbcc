"""One list + watch loop for everything the gateway mirrors from kube-apiserver.

client-go's `Reflector.ListAndWatch` without client-go:
- LIST (paged; one named object by field selector), hand every item to the target's `replace`, then
  WATCH from the list's resourceVersion with bookmarks and a server-side timeout of about 5 min;
- a watch that ends or drops is resumed from the last resourceVersion seen (events, bookmarks),
  so nothing is lost or repeated;
- 410 Gone (HTTP status or in-band ERROR event: "too old resource version") means that
  resourceVersion is compacted: relist at once; any other ERROR event relists after a backoff;
- connection errors and error statuses back off exponentially with downward jitter, capped at 30 s
  (client-go's reflector caps at 30 s too);
- `synced` is set once the first list has been handed over (`HasSynced`).
Used by kube mode's object source (sources/kube.py) and the authentication ConfigMap
(auth/authconfigmap.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import aiohttp
from prometheus_client import CollectorRegistry

from aggregator.kube.calls import ApiCall
from aggregator.kube.client import KubeAPIError, KubeClient, KubeError, describe_error
from aggregator.util.backoff import Backoff
from aggregator.util.logs import fields
from aggregator.web.metrics import Families

log = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
LIST_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
# A watch that ends this fast without delivering anything is treated as a failure (backoff).
SHORT_WATCH = 1.0

# What a list returns: the items and the resourceVersion to watch from ("" watches from now,
# replaying what exists as ADDED events).
Listed = tuple[list[Any], str]
Lister = Callable[[KubeClient], Awaitable[Listed]]


class ReflectorTarget(Protocol):
    """What a reflector keeps up to date."""

    def replace(self, items: list[Any]) -> None:
        """The whole collection, after a (re)list."""

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED event's object."""


@dataclass(frozen=True)
class ListWatch:
    """How to list and watch one collection (client-go's `ListWatch`)."""

    name: str  # metric label and log name
    list: Lister
    watch_call: ApiCall
    namespace: str | None = None
    field_selector: str = ""


def paged_list(call: ApiCall, name: str, *, namespace: str | None = None, field_selector: str = "") -> Lister:
    """A LIST in pages of LIST_PAGE_SIZE, started over if a continue token expires; optionally in
    one namespace and field-selected (one named object: `metadata.name=<name>`).

    Always a LIST, never a GET of one object: a list's resourceVersion is the collection's, current
    when it was served, while an object's own is the version it was last written at, which the watch
    cache has long compacted on a real cluster (watching from it is 410 Gone, every time).
    """
    first: dict[str, str | int] = {"limit": LIST_PAGE_SIZE}
    if field_selector:
        first["fieldSelector"] = field_selector

    async def run(client: KubeClient) -> Listed:
        items: list[Any] = []
        params = dict(first)
        resource_version = ""
        while True:
            response = await client.request(
                call, namespace=namespace, params=params, client_timeout=LIST_TIMEOUT
            )
            if response.status == 410 and "continue" in params:
                # The continue token outlived its snapshot: start the list over.
                log.info("list continue token expired; listing again", extra=fields(resource=name))
                items, params = [], dict(first)
                continue
            if response.status != 200:
                raise api_error(call, response.status, response.body)
            doc = response.json()
            page = doc.get("items") if isinstance(doc, dict) else None
            metadata = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(page, list) or not isinstance(metadata, dict):
                raise ValueError(f"list {name}: response is not a list object")
            items.extend(page)
            resource_version = str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue")
            if not token:
                break
            params = {**first, "continue": str(token)}
        if not resource_version:
            raise ValueError(f"list {name}: response has no resourceVersion")
        return items, resource_version

    return run


class Gone(Exception):
    """The resourceVersion we hold was compacted away: relist."""


class WatchErrorEvent(Exception):
    """An in-band ERROR event other than 410: relist after a backoff, as client-go does."""


class WatchMetrics:
    """How often the reflectors had to start a watch again, and to list everything again."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.restarts = family.counter(
            "aggregator_watch_restarts", "Watches restarted, by resource.", ["resource"]
        )
        self.relists = family.counter(
            "aggregator_watch_relists", "Full relists (410 Gone or ERROR events), by resource.", ["resource"]
        )


@dataclass(eq=False)
class Reflector:
    """Keeps one target equal to one collection of kube-apiserver's."""

    client: KubeClient
    source: ListWatch
    target: ReflectorTarget
    _: KW_ONLY
    metrics: WatchMetrics | None = None
    watch_timeout: float = 300.0
    read_margin: float = 30.0
    backoff: Backoff = field(default_factory=Backoff)
    resource_version: str = field(default="", init=False)
    synced: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    # Set once the first list has succeeded or failed: a caller may wait for the first answer.
    answered: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    # Observability: consecutive failures and the latest reason (for logs and tests).
    failures: int = field(default=0, init=False)
    last_error: str | None = field(default=None, init=False)
    _rng: random.Random = field(default_factory=random.Random, init=False)
    _listed_at: float = field(default=0.0, init=False)
    # The last list's version was gone at once: lists do not reset the backoff until a watch works.
    _gone_at_once: bool = field(default=False, init=False)

    @property
    def name(self) -> str:
        return self.source.name

    async def run(self) -> None:
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Gone as err:
                need_list = True
                self._count_relist()
                log.info(
                    "watch resourceVersion expired; relisting",
                    extra=fields(resource=self.name, resourceVersion=self.resource_version, reason=str(err)),
                )
                # A list's version that is gone again at once means something is wrong: slow down,
                # and keep slowing down (the next list must not reset the backoff).
                if time.monotonic() - self._listed_at < SHORT_WATCH:
                    self._gone_at_once = True
                    await self._fail(str(err))
            except WatchErrorEvent as err:
                need_list = True
                self._count_relist()
                await self._fail(str(err))
            except (KubeError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                if not need_list:
                    self._count_restart()
                await self._fail(_reason(err))
            except Exception as err:
                log.exception("reflector failed unexpectedly", extra=fields(resource=self.name))
                if not need_list:
                    self._count_restart()
                await self._fail(_reason(err))

    def _count_relist(self) -> None:
        if self.metrics is not None:
            self.metrics.relists.labels(self.name).inc()

    def _count_restart(self) -> None:
        if self.metrics is not None:
            self.metrics.restarts.labels(self.name).inc()

    async def _fail(self, reason: str) -> None:
        self.answered.set()
        delay = self.backoff.next()
        self.failures += 1
        self.last_error = reason
        log.warning(
            "kube-apiserver list/watch failed; retrying",
            extra=fields(resource=self.name, reason=reason, retry_in=f"{delay:.2f}s", failures=self.failures),
        )
        await asyncio.sleep(delay)

    def _succeeded(self) -> None:
        self.backoff.reset()
        self.failures = 0
        self.last_error = None

    async def _list(self) -> None:
        items, resource_version = await self.source.list(self.client)
        first = not self.synced.is_set()
        self.target.replace(items)
        self.resource_version = resource_version
        self._listed_at = time.monotonic()
        self.synced.set()
        self.answered.set()
        if not self._gone_at_once:
            self._succeeded()
        log.info(
            "listed" if first else "relisted",
            extra=fields(resource=self.name, objects=len(items), resourceVersion=resource_version),
        )

    async def _watch_once(self) -> None:
        """One watch request; returns when the server ends it or the connection drops."""
        timeout_seconds = max(1, round(self.watch_timeout * self._rng.uniform(1.0, 1.1)))
        params: dict[str, str | int] = {"allowWatchBookmarks": "true", "timeoutSeconds": timeout_seconds}
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        if self.source.field_selector:
            params["fieldSelector"] = self.source.field_selector
        # sock_read above the server's own deadline: a silent dead connection is noticed.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=timeout_seconds + self.read_margin
        )
        started = time.monotonic()
        delivered = 0
        ended_by = "server closed the watch"
        async with self.client.stream(
            self.source.watch_call, namespace=self.source.namespace, params=params, client_timeout=timeout
        ) as response:
            if response.status == 410:
                raise Gone(f"HTTP 410: {message_of(await response.read())}")
            if response.status != 200:
                raise api_error(self.source.watch_call, response.status, await response.read())
            buffer = bytearray()
            try:
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        if line.strip():
                            self._handle_line(line)
                            delivered += 1
                            if delivered == 1:
                                self._gone_at_once = False
                                self._succeeded()
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError) as err:
                ended_by = f"connection dropped ({describe_error(err)})"
        self._count_restart()
        if delivered == 0 and time.monotonic() - started < SHORT_WATCH:
            await self._fail(f"watch ended at once with no events: {ended_by}")
            return
        self._gone_at_once = False
        self._succeeded()
        log.debug(
            "watch ended; resuming",
            extra=fields(resource=self.name, reason=ended_by, resourceVersion=self.resource_version),
        )

    def _handle_line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError as err:
            raise ValueError(f"watch {self.name}: undecodable event: {err}") from err
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ValueError(f"watch {self.name}: event without an object")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            code, message = obj.get("code"), obj.get("message", "")
            if code == 410:
                raise Gone(f"ERROR event 410 {obj.get('reason', '')}: {message}")
            raise WatchErrorEvent(f"ERROR event {code} {obj.get('reason', '')}: {message}")
        metadata = obj.get("metadata")
        rv = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.target.apply(kind, obj)
        elif kind != "BOOKMARK":
            log.warning("ignoring watch event of unknown type", extra=fields(resource=self.name, type=kind))
        # Every event, bookmarks included, moves us forward; a malformed object still happened.
        if isinstance(rv, str) and rv:
            self.resource_version = rv


def message_of(body: bytes) -> str:
    """The `message` of a Status body, or the body's start."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""


def api_error(call: ApiCall, status: int, body: bytes) -> KubeAPIError:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    return KubeAPIError(call, status, doc if isinstance(doc, dict) else None, body.decode("utf-8", "replace"))


def _reason(err: BaseException) -> str:
    return str(err) if isinstance(err, KubeError) else describe_error(err)
