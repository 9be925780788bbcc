"""The gateway's one source of truth: APIService, Service and EndpointSlice objects in memory.

Sources (folder, kube watch) write; everything else (routing, discovery, availability) reads and
reacts to change events. Reads are plain dict lookups so request handlers never wait; writes happen
on the event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace

from aggregator.model.apiservice import APIService, Condition
from aggregator.model.objects import EndpointSlice, Service
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)


class Kind(enum.StrEnum):
    APISERVICE = "APIService"
    SERVICE = "Service"
    ENDPOINTSLICE = "EndpointSlice"


Obj = APIService | Service | EndpointSlice
Key = tuple[str, str]  # (namespace, name); namespace is "" for APIServices

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


def kind_of(obj: Obj) -> Kind:
    if isinstance(obj, APIService):
        return Kind.APISERVICE
    if isinstance(obj, Service):
        return Kind.SERVICE
    return Kind.ENDPOINTSLICE


def key_of(obj: Obj) -> Key:
    return ("", obj.name) if isinstance(obj, APIService) else (obj.namespace, obj.name)


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # ADDED, MODIFIED or DELETED
    kind: Kind
    obj: Obj  # the new object, or the deleted one
    old: Obj | None
    revision: int  # the store's revision after this event
    # A MODIFIED APIService whose spec and labels are unchanged: only its status (conditions)
    # moved. Nothing derived from specs (routes, discovery, OpenAPI) needs to react.
    status_only: bool = False

    def services(self) -> set[Key]:
        """The Services (namespace, name) this event concerns: the Service itself, or an
        EndpointSlice's Service before and after the change (a slice can be relabelled)."""
        keys: set[Key] = set()
        for item in (self.obj, self.old):
            if isinstance(item, Service):
                keys.add((item.namespace, item.name))
            elif isinstance(item, EndpointSlice) and item.service_name:
                keys.add((item.namespace, item.service_name))
        return keys


def _labels(obj: APIService) -> object:
    metadata = obj.raw.get("metadata")
    return metadata.get("labels") if isinstance(metadata, dict) else None


def status_only_change(old: Obj, new: Obj) -> bool:
    """True when an APIService changed nothing but its conditions (and resourceVersion)."""
    if not (isinstance(old, APIService) and isinstance(new, APIService)):
        return False
    return replace(old, conditions=(), resource_version="") == replace(
        new, conditions=(), resource_version=""
    ) and _labels(old) == _labels(new)


def _same(old: Obj, new: Obj) -> bool:
    """True when `new` carries nothing `old` does not (a resync, or an unchanged file)."""
    if new.resource_version and new.resource_version != old.resource_version:
        return False
    if replace(new, resource_version=old.resource_version) != old:
        return False
    return not isinstance(old, APIService) or not isinstance(new, APIService) or old.raw == new.raw


class Subscription:
    """An unbounded queue of events: a slow subscriber never loses one and never blocks a writer."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        self._queue.put_nowait(event)

    async def get(self) -> Event:
        return await self._queue.get()

    def close(self) -> None:
        self._store._subscriptions.discard(self)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        try:
            while True:
                yield await self._queue.get()
        finally:
            self.close()


class Store:
    def __init__(self) -> None:
        self._objects: dict[Kind, dict[Key, Obj]] = {kind: {} for kind in Kind}
        # Indexes by Service. A Service nearly always has one slice and one APIService: tuples,
        # replaced on change, cost a quarter of the dict or set they were (an entry per Service in
        # every process of the gateway).
        self._slices_by_service: dict[Key, tuple[EndpointSlice, ...]] = {}
        self._apiservices_by_service: dict[Key, tuple[str, ...]] = {}
        self._listeners: list[Callable[[Event], None]] = []
        self._subscriptions: set[Subscription] = set()
        self._synced = asyncio.Event()
        self.revision = 0

    # --- reads -----------------------------------------------------------------------------------

    def apiservice(self, name: str) -> APIService | None:
        obj = self._objects[Kind.APISERVICE].get(("", name))
        return obj if isinstance(obj, APIService) else None

    def apiservices(self) -> list[APIService]:
        return [o for o in self._objects[Kind.APISERVICE].values() if isinstance(o, APIService)]

    def service(self, namespace: str, name: str) -> Service | None:
        obj = self._objects[Kind.SERVICE].get((namespace, name))
        return obj if isinstance(obj, Service) else None

    def endpointslices_for(self, namespace: str, service_name: str) -> list[EndpointSlice]:
        return list(self._slices_by_service.get((namespace, service_name), ()))

    def apiservices_for_service(self, namespace: str, name: str) -> list[APIService]:
        """The APIServices backed by this Service (an index: every Service and EndpointSlice event
        asks, so a scan of every APIService made start-up quadratic)."""
        names = self._apiservices_by_service.get((namespace, name))
        if not names:
            return []
        found = (self.apiservice(n) for n in names)
        return [svc for svc in found if svc is not None]

    def affected_by(self, event: Event) -> list[APIService]:
        """The APIServices a change of a Service or an EndpointSlice touches (what availability,
        discovery and the proxy's endpoints look at again)."""
        found: list[APIService] = []
        for namespace, service in event.services():
            found.extend(self.apiservices_for_service(namespace, service))
        return found

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        return self._objects[kind].get((namespace, name))

    def objects(self, kind: Kind) -> list[Obj]:
        return list(self._objects[kind].values())

    # --- sync state ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def mark_synced(self) -> None:
        if not self._synced.is_set():
            self._synced.set()
            log.info(
                "object store synced", extra={"fields": {"objects": sum(map(len, self._objects.values()))}}
            )

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def when_synced(self, tasks: TaskSet, begin: Callable[[], None], *, name: str) -> None:
        """Call `begin` once the store has synced: at once when it has (local mode reads its folder
        before the components start), else from a task of `tasks`. Like upstream's controllers
        waiting for their informers: a Service not listed yet is not a missing Service."""
        if self.synced:
            begin()
            return

        async def begin_at_sync() -> None:
            await self.wait_synced()
            begin()

        tasks.spawn(begin_at_sync(), name=name)

    def synced_check(self) -> str | None:
        """The `/readyz` check `apiservice-registry-synced`."""
        return (
            None if self.synced else "initial list of APIServices, Services and EndpointSlices not complete"
        )

    # --- change notification ---------------------------------------------------------------------

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Called synchronously for every event; keep it quick (rebuild a cache, wake a task)."""
        self._listeners.append(listener)

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        self._subscriptions.add(sub)
        return sub

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("store listener failed on %s %s", event.type, event.kind)
        for sub in list(self._subscriptions):
            sub.put(event)

    # --- writes ----------------------------------------------------------------------------------

    def _stamp(self, obj: Obj) -> Obj:
        """Objects without a resourceVersion (from files) get the store's revision."""
        return obj if obj.resource_version else replace(obj, resource_version=str(self.revision))

    def _index(self, obj: Obj, *, remove: bool) -> None:
        if isinstance(obj, APIService):
            if obj.service is None:
                return
            key = (obj.service.namespace, obj.service.name)
            names = tuple(n for n in self._apiservices_by_service.get(key, ()) if n != obj.name)
            if not remove:
                names += (obj.name,)
            if names:
                self._apiservices_by_service[key] = names
            else:
                self._apiservices_by_service.pop(key, None)
            return
        if isinstance(obj, EndpointSlice):
            key = (obj.namespace, obj.service_name)
            slices = tuple(s for s in self._slices_by_service.get(key, ()) if s.name != obj.name)
            if not remove:
                slices += (obj,)
            if slices:
                self._slices_by_service[key] = slices
            else:
                self._slices_by_service.pop(key, None)

    def upsert(self, obj: Obj, *, preserve_status: bool = False) -> Event | None:
        """Add or replace an object; returns the event, or None when nothing changed.

        `preserve_status` is the main resource's update strategy upstream: a spec write keeps the
        conditions already recorded (local mode, where the folder holds only specs).
        """
        kind, key = kind_of(obj), key_of(obj)
        old = self._objects[kind].get(key)
        if preserve_status and isinstance(old, APIService) and isinstance(obj, APIService):
            obj = replace(obj, conditions=old.conditions)
        if old is not None and _same(old, obj):
            return None
        self.revision += 1
        obj = self._stamp(obj)
        if old is not None:
            self._index(old, remove=True)
        self._objects[kind][key] = obj
        self._index(obj, remove=False)
        event = Event(
            MODIFIED if old is not None else ADDED,
            kind,
            obj,
            old,
            self.revision,
            status_only=old is not None and status_only_change(old, obj),
        )
        self._emit(event)
        return event

    def delete(self, kind: Kind, namespace: str, name: str) -> Event | None:
        old = self._objects[kind].pop((namespace, name), None)
        if old is None:
            return None
        self.revision += 1
        self._index(old, remove=True)
        event = Event(DELETED, kind, old, old, self.revision)
        self._emit(event)
        return event

    def replace_all(self, kind: Kind, objs: Iterable[Obj], *, preserve_status: bool = False) -> list[Event]:
        """Make `kind` hold exactly `objs` (a relist, or a reloaded folder); emits only the differences."""
        desired = {key_of(o): o for o in objs}
        events = [
            e for key in list(self._objects[kind]) if key not in desired if (e := self.delete(kind, *key))
        ]
        events.extend(e for o in desired.values() if (e := self.upsert(o, preserve_status=preserve_status)))
        return events

    def set_apiservice_conditions(self, name: str, conditions: tuple[Condition, ...]) -> Event | None:
        """Local mode's status subresource: new conditions, a new resourceVersion, a MODIFIED event."""
        current = self.apiservice(name)
        if current is None or current.conditions == conditions:
            return None
        return self.upsert(replace(current, conditions=conditions, resource_version=""))
