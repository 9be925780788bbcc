"""Kube mode: APIServices, Services and EndpointSlices from kube-apiserver, by list + watch.

One reflector per resource (sources/reflector.py: list, watch from the list's resourceVersion,
resume after drops, relist on 410 Gone, backoff); this module decodes what they deliver into the
store. A malformed object is logged and skipped; it never replaces or removes the version we have.
The store is marked synced once every resource has been listed (readyz `apiservice-registry-synced`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.kube import calls
from aggregator.kube.calls import ApiCall
from aggregator.kube.client import KubeClient
from aggregator.model.apiservice import decode_apiservice
from aggregator.model.decode import DecodeError
from aggregator.model.objects import decode_endpointslice, decode_service
from aggregator.sources.reflector import ListWatch, Reflector, WatchMetrics, paged_list
from aggregator.sources.store import DELETED, Key, Kind, Obj, Store
from aggregator.util.backoff import Backoff
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)


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


class StoreTarget:
    """What a reflector of one resource does to the store: decode, then replace or change."""

    def __init__(self, spec: WatchedResource, store: Store) -> None:
        self.spec = spec
        self.store = store

    @property
    def name(self) -> str:
        return self.spec.resource

    def replace(self, items: list[Any]) -> None:
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
        log.debug("store replaced", extra=fields(resource=self.name, changes=len(events)))

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == DELETED:
            key = self.spec.key(obj)
            if key is None:
                log.error("skipping DELETED event without a name", extra=fields(resource=self.name))
            elif self.store.delete(self.spec.kind, *key) is not None:
                self._log_change(DELETED, key[1], key[0])
            return
        decoded = self._decode(obj)
        if decoded is not None:
            event_out = self.store.upsert(decoded)
            if event_out is not None:
                self._log_change(event_out.type, decoded.name, getattr(decoded, "namespace", ""))

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


class KubeSource:
    """The object source in kube mode: three reflectors and the store's synced flag."""

    def __init__(
        self,
        client: KubeClient,
        store: Store,
        metrics: WatchMetrics,
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
                ListWatch(spec.resource, paged_list(spec.list_call, spec.resource), spec.watch_call),
                StoreTarget(spec, store),
                metrics=metrics,
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
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors.values()))
        self.store.mark_synced()

    async def stop(self) -> None:
        await self._tasks.close()
