"""In-memory object storage with etcd-like resourceVersions and a bounded event history for watches.

Every write bumps one global revision (like etcd), stamps it into the object's
`metadata.resourceVersion` and appends an event to a ring buffer. A watch from resourceVersion N
replays the buffered events after N and then follows live ones; when N is older than the buffer
the watch gets the `410 Expired` error event kube-apiserver's watch cache sends. Everything runs
on one event loop, so a read of the history and the subscription happen atomically.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aggregator.model.meta import ordered_metadata

JSON = dict[str, Any]

Key = tuple[str, str, str]  # (resource plural, namespace or "", name)


@dataclass
class Event:
    type: str  # ADDED | MODIFIED | DELETED
    resource: str
    obj: JSON  # internal form, as stored after the change (before deletion for DELETED)
    old: JSON | None
    revision: int


@dataclass(eq=False)
class Watcher:
    """One watch's queue; `None` in the queue means the server is stopping."""

    resource: str
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)


class TooOldResourceVersion(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


class ObjectStore:
    """All objects of the server, keyed by (resource, namespace, name)."""

    def __init__(self, *, history: int = 1000) -> None:
        self.revision = 1
        self._objects: dict[Key, JSON] = {}
        self._history: deque[Event] = deque(maxlen=history)
        self._watchers: set[Watcher] = set()
        self.closed = False

    # --- reads -----------------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> JSON | None:
        obj = self._objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, namespace: str | None = None) -> list[JSON]:
        """Objects sorted by namespace then name (etcd key order); namespace None = all."""
        keys = sorted(
            k for k in self._objects if k[0] == resource and (namespace is None or k[1] == namespace)
        )
        return [copy.deepcopy(self._objects[k]) for k in keys]

    def all_of(self, resource: str) -> Iterator[JSON]:
        """No copies: for quick scans that do not keep or modify the objects."""
        return (obj for key, obj in self._objects.items() if key[0] == resource)

    # --- writes ----------------------------------------------------------------------------------

    def _key(self, resource: str, obj: JSON) -> Key:
        meta = obj["metadata"]
        return (resource, meta.get("namespace", ""), meta["name"])

    def _commit(self, kind: str, resource: str, obj: JSON, old: JSON | None) -> JSON:
        self.revision += 1
        if kind != "DELETED":
            obj["metadata"]["resourceVersion"] = str(self.revision)
            obj["metadata"] = ordered_metadata(obj["metadata"])
            self._objects[self._key(resource, obj)] = obj
        else:
            # The DELETED event carries the object with the deletion's revision, as etcd3 does.
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.revision)
            del self._objects[self._key(resource, obj)]
        event = Event(kind, resource, obj, old, self.revision)
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.resource == resource:
                watcher.queue.put_nowait(event)
        return copy.deepcopy(obj)

    def create(self, resource: str, obj: JSON) -> JSON:
        """Store a new object (the caller checked it does not exist)."""
        return self._commit("ADDED", resource, copy.deepcopy(obj), None)

    def update(self, resource: str, obj: JSON) -> JSON:
        old = self._objects[self._key(resource, obj)]
        return self._commit("MODIFIED", resource, copy.deepcopy(obj), old)

    def delete(self, resource: str, namespace: str, name: str, final: JSON | None = None) -> JSON:
        """Remove the object; `final` is its last state when an update completes a deletion
        (the last finalizer removed), which watchers then see as the DELETED object."""
        current = self._objects[(resource, namespace, name)]
        return self._commit("DELETED", resource, final if final is not None else current, current)

    # --- watch -----------------------------------------------------------------------------------

    def watch(self, resource: str, since: int | None) -> tuple[list[Event], Watcher]:
        """Buffered events after `since` (none when None) and a live subscription.

        Raises TooOldResourceVersion when events after `since` were already dropped.
        """
        backlog: list[Event] = []
        if since is not None and since < self.revision:
            oldest = self._history[0].revision if self._history else self.revision + 1
            if since < oldest - 1:
                raise TooOldResourceVersion(since, oldest - 1)
            backlog = [e for e in self._history if e.revision > since and e.resource == resource]
        watcher = Watcher(resource)
        if self.closed:
            watcher.queue.put_nowait(None)
        else:
            self._watchers.add(watcher)
        return backlog, watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def close(self) -> None:
        """End every watch (server stopping)."""
        self.closed = True
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()
