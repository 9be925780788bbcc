"""Kube mode: APIServices, Services and EndpointSlices from kube-apiserver, by list + watch.

One reflector per resource, client-go's contract without client-go:
- LIST (paged), replace the store's objects of that kind (only differences become events), then
  WATCH from the list's resourceVersion with bookmarks and a server-side timeout of about 5 min;
- a watch that ends or drops is resumed from the last resourceVersion seen (events, bookmarks),
  so nothing is lost or repeated;
- 410 Gone (HTTP status or in-band ERROR event) means that resourceVersion is compacted: relist
  once; any other ERROR event also relists;
- connection errors and error statuses back off exponentially with jitter, capped at 30 s;
- a malformed object is logged and skipped; it never replaces or removes the version we have.
The store is marked synced once every resource has been listed (readyz `apiservice-registry-synced`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from aggregator.kube import calls
from aggregator.kube.calls import ApiCall
from aggregator.kube.client import KubeAPIError, KubeClient, KubeError, describe_error
from aggregator.model.apiservice import decode_apiservice
from aggregator.model.decode import DecodeError
from aggregator.model.objects import decode_endpointslice, decode_service
from aggregator.sources.store import ADDED, DELETED, MODIFIED, Key, Kind, Obj, Store
from aggregator.util.backoff import Backoff
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet
from aggregator.web.metrics import Metrics

log = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
LIST_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
# A watch that ends this fast without delivering anything is treated as a failure (backoff).
SHORT_WATCH = 1.0


@dataclass(frozen=True)
class WatchedResource:
    """A resource the gateway mirrors: how to call for it and how to decode it."""

    resource: str  # metric label and log name
    kind: Kind
    api_version: str
    kind_name: str
    namespaced: bool
    list_call: ApiCall
    watch_call: ApiCall
    decode: Callable[[Mapping[str, Any]], Obj]

    def key(self, obj: Mapping[str, Any]) -> Key | None:
        """The store key from metadata alone (DELETED events and malformed objects)."""
        metadata = obj.get("metadata")
        if not isinstance(metadata, Mapping):
            return None
        name, namespace = metadata.get("name"), metadata.get("namespace")
        if not isinstance(name, str) or not name:
            return None
        if not self.namespaced:
            return ("", name)
        return (namespace if isinstance(namespace, str) and namespace else "default", name)


APISERVICES = WatchedResource(
    "apiservices",
    Kind.APISERVICE,
    "apiregistration.k8s.io/v1",
    "APIService",
    False,
    calls.LIST_APISERVICES,
    calls.WATCH_APISERVICES,
    decode_apiservice,
)
SERVICES = WatchedResource(
    "services", Kind.SERVICE, "v1", "Service", True, calls.LIST_SERVICES, calls.WATCH_SERVICES, decode_service
)
ENDPOINTSLICES = WatchedResource(
    "endpointslices",
    Kind.ENDPOINTSLICE,
    "discovery.k8s.io/v1",
    "EndpointSlice",
    True,
    calls.LIST_ENDPOINTSLICES,
    calls.WATCH_ENDPOINTSLICES,
    decode_endpointslice,
)
WATCHED = (APISERVICES, SERVICES, ENDPOINTSLICES)


class Gone(Exception):
    """The resourceVersion we hold was compacted away: relist."""


class WatchErrorEvent(Exception):
    """An in-band ERROR event other than 410: relist after a backoff, as client-go does."""


class Reflector:
    """Keeps the store's objects of one kind equal to kube-apiserver's."""

    def __init__(
        self,
        client: KubeClient,
        spec: WatchedResource,
        store: Store,
        metrics: Metrics,
        *,
        watch_timeout: float = 300.0,
        read_margin: float = 30.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.client = client
        self.spec = spec
        self.store = store
        self.metrics = metrics
        self.watch_timeout = watch_timeout
        self.read_margin = read_margin
        self.backoff = backoff or Backoff()
        self.resource_version = ""
        self.listed = asyncio.Event()
        # Observability: consecutive failures and the latest reason (for logs and tests).
        self.failures = 0
        self.last_error: str | None = None
        self._rng = random.Random()
        self._listed_at = 0.0

    @property
    def name(self) -> str:
        return self.spec.resource

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
                self.metrics.watch_relists.labels(self.name).inc()
                log.info(
                    "watch resourceVersion expired; relisting",
                    extra=fields(resource=self.name, resourceVersion=self.resource_version, reason=str(err)),
                )
                # A list's version that is gone again at once means something is wrong: slow down.
                if time.monotonic() - self._listed_at < SHORT_WATCH:
                    await self._fail(str(err))
            except WatchErrorEvent as err:
                need_list = True
                self.metrics.watch_relists.labels(self.name).inc()
                await self._fail(str(err))
            except (KubeError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                if not need_list:
                    self.metrics.watch_restarts.labels(self.name).inc()
                await self._fail(_reason(err))
            except Exception as err:
                log.exception("reflector failed unexpectedly", extra=fields(resource=self.name))
                if not need_list:
                    self.metrics.watch_restarts.labels(self.name).inc()
                await self._fail(_reason(err))

    async def _fail(self, reason: str) -> None:
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

    # --- LIST ----------------------------------------------------------------------------------------

    async def _list(self) -> None:
        items: list[Any] = []
        params: dict[str, str | int] = {"limit": LIST_PAGE_SIZE}
        resource_version = ""
        while True:
            response = await self.client.request(
                self.spec.list_call, params=params, client_timeout=LIST_TIMEOUT
            )
            if response.status == 410 and "continue" in params:
                # The continue token outlived its snapshot: start the list over.
                log.info("list continue token expired; listing again", extra=fields(resource=self.name))
                items, params = [], {"limit": LIST_PAGE_SIZE}
                continue
            if response.status != 200:
                raise _api_error(self.spec.list_call, response.status, response.body)
            doc = response.json()
            page = doc.get("items") if isinstance(doc, dict) else None
            metadata = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(page, list) or not isinstance(metadata, dict):
                raise ValueError(f"list {self.name}: response is not a list object")
            items.extend(page)
            resource_version = str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue")
            if not token:
                break
            params = {"limit": LIST_PAGE_SIZE, "continue": str(token)}
        if not resource_version:
            raise ValueError(f"list {self.name}: response has no resourceVersion")
        objects: list[Obj] = []
        for item in items:
            if not isinstance(item, dict):
                log.error("skipping list item that is not an object", extra=fields(resource=self.name))
                continue
            item.setdefault("apiVersion", self.spec.api_version)
            item.setdefault("kind", self.spec.kind_name)
            obj = self._decode(item)
            if obj is None:
                # Keep what we had for it, exactly as a malformed MODIFIED event does.
                key = self.spec.key(item)
                kept = self.store.get(self.spec.kind, *key) if key else None
                if kept is not None:
                    objects.append(kept)
                continue
            objects.append(obj)
        events = self.store.replace_all(self.spec.kind, objects)
        first = not self.listed.is_set()
        self.resource_version = resource_version
        self._listed_at = time.monotonic()
        self.listed.set()
        self._succeeded()
        log.info(
            "listed" if first else "relisted",
            extra=fields(
                resource=self.name,
                objects=len(objects),
                changes=len(events),
                resourceVersion=resource_version,
            ),
        )

    # --- WATCH ---------------------------------------------------------------------------------------

    async def _watch_once(self) -> None:
        """One watch request; returns when the server ends it or the connection drops."""
        timeout_seconds = max(1, round(self.watch_timeout * self._rng.uniform(1.0, 1.1)))
        params: dict[str, str | int] = {
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        # sock_read above the server's own deadline: a silent dead connection is noticed.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=timeout_seconds + self.read_margin
        )
        started = time.monotonic()
        delivered = 0
        ended_by = "server closed the watch"
        async with self.client.stream(
            self.spec.watch_call, params=params, client_timeout=timeout
        ) as response:
            if response.status == 410:
                raise Gone(f"HTTP 410: {_message(await response.read())}")
            if response.status != 200:
                raise _api_error(self.spec.watch_call, response.status, await response.read())
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
                                self._succeeded()
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError) as err:
                ended_by = f"connection dropped ({describe_error(err)})"
        self.metrics.watch_restarts.labels(self.name).inc()
        if delivered == 0 and time.monotonic() - started < SHORT_WATCH:
            await self._fail(f"watch ended at once with no events: {ended_by}")
            return
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
        if kind in (ADDED, MODIFIED):
            decoded = self._decode(obj)
            if decoded is not None:
                event_out = self.store.upsert(decoded)
                if event_out is not None:
                    self._log_change(event_out.type, decoded.name, getattr(decoded, "namespace", ""))
        elif kind == DELETED:
            key = self.spec.key(obj)
            if key is None:
                log.error("skipping DELETED event without a name", extra=fields(resource=self.name))
            elif self.store.delete(self.spec.kind, *key) is not None:
                self._log_change(DELETED, key[1], key[0])
        elif kind != "BOOKMARK":
            log.warning("ignoring watch event of unknown type", extra=fields(resource=self.name, type=kind))
        # Every event, bookmarks included, moves us forward; a malformed object still happened.
        if isinstance(rv, str) and rv:
            self.resource_version = rv

    def _decode(self, obj: dict[str, Any]) -> Obj | None:
        try:
            return self.spec.decode(obj)
        except DecodeError as err:
            key = self.spec.key(obj)
            log.error(
                "skipping malformed object; keeping the previous version if any",
                extra=fields(
                    resource=self.name,
                    namespace=key[0] if key else "",
                    name=key[1] if key else "",
                    reason=str(err),
                ),
            )
            return None

    def _log_change(self, kind: str, name: str, namespace: str) -> None:
        level = logging.INFO if self.spec.kind is Kind.APISERVICE else logging.DEBUG
        log.log(
            level,
            "object %s",
            kind.lower(),
            extra=fields(resource=self.name, namespace=namespace, name=name, revision=self.store.revision),
        )


def _message(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""


def _api_error(call: ApiCall, status: int, body: bytes) -> KubeAPIError:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    return KubeAPIError(call, status, doc if isinstance(doc, dict) else None, body.decode("utf-8", "replace"))


def _reason(err: BaseException) -> str:
    return str(err) if isinstance(err, KubeError) else describe_error(err)


class KubeSource:
    """The object source in kube mode: three reflectors and the store's synced flag."""

    def __init__(
        self,
        client: KubeClient,
        store: Store,
        metrics: Metrics,
        *,
        watch_timeout: float = 300.0,
        read_margin: float = 30.0,
        backoff_initial: float = 0.5,
        backoff_cap: float = 30.0,
        resources: tuple[WatchedResource, ...] = WATCHED,
    ) -> None:
        self.store = store
        self.reflectors = {
            spec.resource: Reflector(
                client,
                spec,
                store,
                metrics,
                watch_timeout=watch_timeout,
                read_margin=read_margin,
                backoff=Backoff(backoff_initial, backoff_cap),
            )
            for spec in resources
        }
        self._tasks = TaskSet("kube-source")

    def reflector(self, resource: str) -> Reflector:
        return self.reflectors[resource]

    async def start(self) -> None:
        """Start the reflectors and return at once: an unreachable kube-apiserver only delays readiness."""
        for name, reflector in self.reflectors.items():
            self._tasks.spawn(reflector.run(), name=f"reflector-{name}")
        self._tasks.spawn(self._mark_synced(), name="synced")

    async def _mark_synced(self) -> None:
        await asyncio.gather(*(r.listed.wait() for r in self.reflectors.values()))
        self.store.mark_synced()

    async def stop(self) -> None:
        await self._tasks.close()
