"""The proxy's handling table: prepared once per change of what it depends on, read by requests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from aggregator.assembly import build_backends
from aggregator.backends.addresses import PendingLookup
from aggregator.backends.errors import BackendError, Hop
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.objects import Endpoint, EndpointPort, EndpointSlice, Service
from aggregator.proxy.destination import Destination
from aggregator.proxy.endpoints import Endpoint as Balanced
from aggregator.proxy.handling import HandlingTable
from aggregator.sources.store import Kind, Store
from aggregator.web.metrics import Metrics
from tests.backends.test_addresses import service
from tests.support.options import flag_options

NAME = "v1.demo.example.com"


def apiservice(**kw: Any) -> APIService:
    base: dict[str, Any] = {
        "name": NAME,
        "group": "demo.example.com",
        "version": "v1",
        "service": ServiceReference("demo", "api", 443),
        "group_priority_minimum": 1000,
        "version_priority": 15,
    }
    base.update(kw)
    return APIService(**base)


def endpoints(*addresses: tuple[str, bool | None], name: str = "api-x") -> EndpointSlice:
    return EndpointSlice(
        "demo",
        name,
        "api",
        ports=(EndpointPort("https", 8443),),
        endpoints=tuple(Endpoint((ip,), ready) for ip, ready in addresses),
    )


def table(
    *objs: APIService | Service | EndpointSlice, endpoint_routing: bool = False
) -> tuple[Store, HandlingTable]:
    store = Store()
    for obj in objs:
        store.upsert(obj)
    options = flag_options(apiservices_dir=".", enable_aggregator_routing=endpoint_routing)
    backends = build_backends(options, store, Metrics())
    handling = HandlingTable(store, backends)
    store.add_listener(handling.on_store_event)
    return store, handling


def destination(handling: HandlingTable) -> Destination:
    info = handling.get(NAME)
    assert info is not None
    picked = info.pick()
    assert isinstance(picked, Balanced)
    return picked.destination


def test_one_preparation_serves_every_request_until_something_it_depends_on_changes() -> None:
    store, handling = table(apiservice(), service())
    info = handling.get(NAME)
    assert info is not None
    assert (info.apiservice.name, info.transport_error) == (NAME, None)
    assert handling.get(NAME) is info  # prepared once, read many times
    assert destination(handling) is destination(handling)  # the very object, nothing rebuilt
    assert (destination(handling).host, destination(handling).port) == ("10.0.0.5", 443)

    store.upsert(service(namespace="elsewhere"))  # another Service: nothing of this APIService moved
    assert handling.get(NAME) is info

    store.upsert(service(cluster_ip="10.0.0.6"))  # its Service
    moved = handling.get(NAME)
    assert moved is not info and destination(handling).host == "10.0.0.6"

    store.upsert(apiservice(version_priority=20))  # the APIService itself
    assert handling.get(NAME) is not moved


def test_a_new_front_proxy_client_certificate_prepares_everything_again() -> None:
    _, handling = table(apiservice(), service())
    info = handling.get(NAME)
    handling.backends.client_certificate.generation += 1  # what a reload does
    assert handling.get(NAME) is not info


def test_local_and_vanished_apiservices_have_no_handling_info() -> None:
    store, handling = table(apiservice(service=None), service())
    assert handling.get(NAME) is None
    store.upsert(apiservice())
    assert handling.get(NAME) is not None
    store.delete(Kind.APISERVICE, "", NAME)
    assert handling.get(NAME) is None


def test_an_unresolvable_service_is_an_error_picked_per_request() -> None:
    store, handling = table(apiservice())  # no Service object
    info = handling.get(NAME)
    assert info is not None
    with pytest.raises(BackendError) as failed:
        info.pick()
    assert (failed.value.hop, failed.value.cause) == (Hop.SERVICE, 'service "api" not found')
    store.upsert(service())  # the Service appears: the next request resolves
    assert destination(handling).host == "10.0.0.5"


def test_endpoint_routing_picks_among_the_ready_endpoints_only() -> None:
    store, handling = table(
        apiservice(),
        service(),
        endpoints(("10.1.0.1", True), ("10.1.0.2", False), ("10.1.0.3", None)),
        endpoint_routing=True,
    )
    info = handling.get(NAME)
    assert info is not None
    picked: set[str] = set()
    for _ in range(200):
        pick = info.pick()
        assert isinstance(pick, Balanced)  # endpoints, not an ExternalName still to look up
        picked.add(pick.destination.host)
    assert picked == {"10.1.0.1", "10.1.0.3"}
    store.upsert(endpoints(("10.1.0.9", True)))  # the slice changes: so does where requests go
    assert {destination(handling).host} == {"10.1.0.9"}


def test_an_external_name_is_looked_up_per_request_and_its_destinations_kept() -> None:
    store, handling = table(apiservice(), service(type="ExternalName", external_name="api.example.net"))
    handling.backends.resolver.allow_external_name = True
    store.upsert(replace(service(type="ExternalName", external_name="api.example.net"), resource_version="2"))
    info = handling.get(NAME)
    assert info is not None
    pending = info.pick()
    assert isinstance(pending, PendingLookup) and pending.host == "api.example.net"
