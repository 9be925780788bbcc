"""The store: events, subscribers that never miss one, relist diffs, status preservation."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from aggregator.model.apiservice import APIService, Condition, ServiceReference
from aggregator.model.objects import Endpoint, EndpointSlice, Service
from aggregator.sources.store import ADDED, DELETED, MODIFIED, Event, Kind, Store


def svc(name: str = "v1.a.io", **kw: Any) -> APIService:
    group, version = name.split(".", 1)[1], name.split(".", 1)[0]
    base = APIService(name, group, version, ServiceReference("ns", "api"), 1000, 15)
    return replace(base, **kw)


async def test_upsert_delete_and_unchanged() -> None:
    store = Store()
    seen: list[Event] = []
    store.add_listener(seen.append)
    assert store.upsert(svc()) is not None
    assert store.upsert(svc()) is None  # identical: no event
    assert store.upsert(svc(version_priority=20)) is not None
    assert store.delete(Kind.APISERVICE, "", "v1.a.io") is not None
    assert store.delete(Kind.APISERVICE, "", "v1.a.io") is None
    assert [e.type for e in seen] == [ADDED, MODIFIED, DELETED]
    assert [e.revision for e in seen] == [1, 2, 3]
    assert isinstance(seen[1].old, APIService) and seen[1].old.version_priority == 15


async def test_objects_without_resource_version_get_the_store_revision() -> None:
    store = Store()
    store.upsert(svc())
    store.upsert(svc("v1.b.io"))
    found = store.apiservice("v1.b.io")
    assert found is not None and found.resource_version == "2"
    kube = svc("v1.c.io", resource_version="777")
    store.upsert(kube)
    found = store.apiservice("v1.c.io")
    assert found is not None and found.resource_version == "777"


async def test_subscribers_get_every_event_in_order() -> None:
    store = Store()
    sub = store.subscribe()
    for i in range(100):
        store.upsert(svc(f"v{i + 1}.a.io"))
    received = [await asyncio.wait_for(sub.get(), 1) for _ in range(100)]
    assert [e.obj.name for e in received] == [f"v{i + 1}.a.io" for i in range(100)]
    sub.close()
    store.upsert(svc("v999.a.io"))  # closed subscriptions are no longer fed


async def test_replace_all_emits_only_differences() -> None:
    store = Store()
    store.replace_all(Kind.APISERVICE, [svc("v1.a.io"), svc("v1.b.io")])
    events = store.replace_all(Kind.APISERVICE, [svc("v1.b.io", version_priority=9), svc("v1.c.io")])
    assert sorted((e.type, e.obj.name) for e in events) == [
        (ADDED, "v1.c.io"),
        (DELETED, "v1.a.io"),
        (MODIFIED, "v1.b.io"),
    ]


async def test_preserve_status_keeps_conditions_on_spec_writes() -> None:
    store = Store()
    store.upsert(svc())
    cond = (Condition("Available", "True", "t", "Passed", "all checks passed"),)
    assert store.set_apiservice_conditions("v1.a.io", cond) is not None
    assert store.upsert(svc(), preserve_status=True) is None  # same spec, status kept: no change
    store.upsert(svc(version_priority=3), preserve_status=True)
    found = store.apiservice("v1.a.io")
    assert found is not None and found.conditions == cond


async def test_endpointslice_index_follows_updates() -> None:
    store = Store()
    store.upsert(Service("ns", "api", cluster_ip="10.0.0.1"))
    store.upsert(EndpointSlice("ns", "api-1", "api", endpoints=(Endpoint(("10.1.0.1",)),)))
    store.upsert(EndpointSlice("ns", "api-2", "api"))
    assert {s.name for s in store.endpointslices_for("ns", "api")} == {"api-1", "api-2"}
    store.upsert(EndpointSlice("ns", "api-2", "other"))
    assert {s.name for s in store.endpointslices_for("ns", "api")} == {"api-1"}
    store.delete(Kind.ENDPOINTSLICE, "ns", "api-1")
    assert store.endpointslices_for("ns", "api") == []
    store.upsert(svc())
    assert [a.name for a in store.apiservices_for_service("ns", "api")] == ["v1.a.io"]


async def test_synced_state_backs_readyz_check() -> None:
    store = Store()
    assert store.synced_check() is not None
    store.mark_synced()
    assert store.synced_check() is None
    await asyncio.wait_for(store.wait_synced(), 1)


async def test_event_names_the_services_it_concerns_before_and_after() -> None:
    store = Store()
    added = store.upsert(Service("ns", "api"))
    assert added is not None and added.services() == {("ns", "api")}
    store.upsert(EndpointSlice("ns", "s1", "api"))
    moved = store.upsert(EndpointSlice("ns", "s1", "other"))
    assert moved is not None and moved.services() == {("ns", "api"), ("ns", "other")}
    apiservice_event = store.upsert(svc())
    assert apiservice_event is not None and apiservice_event.services() == set()
