"""One object per APIService (`proxy/apiservices.ServedAPIService`): its handling info is prepared
when something it depends on changes, never on the request path, and read by requests."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.assembly import build_backends, flag_identity_policy
from aggregator.backends.addresses import PendingLookup
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.metrics import BackendMetrics
from aggregator.config import complete
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.objects import Endpoint, EndpointPort, EndpointSlice, Service
from aggregator.proxy.apiservices import APIServiceProxy
from aggregator.proxy.destination import Destination
from aggregator.proxy.endpoints import Endpoint as Balanced
from aggregator.proxy.forward import Forwarder
from aggregator.proxy.handling import HandlingInfo, HandlingTable
from aggregator.proxy.metrics import ProxyMetrics
from aggregator.proxy.upgrade import UpgradeTunnel
from aggregator.sources.store import Kind, Store
from aggregator.tls.issue import issue_client_cert, load_pair, write_pair
from aggregator.web.responses import serve_not_found
from tests.backends.test_addresses import service
from tests.support.backend import AlwaysAvailable
from tests.support.options import flag_options
from tests.support.pki import PKI

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


class Served:
    """An APIService proxy over a store, wired as the composition root wires it."""

    def __init__(self, *objs: APIService | Service | EndpointSlice, endpoint_routing: bool = False, **flags: Any):
        self.store = store = Store()
        for obj in objs:
            store.upsert(obj)
        options = flag_options(apiservices_dir=".", enable_aggregator_routing=endpoint_routing, **flags)
        registry = CollectorRegistry()
        backend_metrics = BackendMetrics(registry)
        metrics = ProxyMetrics(registry, backend_metrics)
        identity = flag_identity_policy(options.authentication.requestheader)
        self.backends = backends = build_backends(
            complete(options).backends, store, backend_metrics, identity=identity
        )
        self.handling = HandlingTable(store, backends)
        self.proxy = APIServiceProxy(
            store,
            availability=AlwaysAvailable(),
            handling=self.handling,
            forwarder=Forwarder(metrics, UpgradeTunnel(metrics)),
            fallback=serve_not_found,
        )
        store.add_listener(self.proxy.on_store_event)
        backends.client_certificate.add_listener(self.proxy.client_certificate_changed)

    def info(self) -> HandlingInfo | None:
        served = self.proxy.served(NAME)
        return served.info if served is not None else None


def table(
    *objs: APIService | Service | EndpointSlice, endpoint_routing: bool = False, **flags: Any
) -> tuple[Store, Served]:
    served = Served(*objs, endpoint_routing=endpoint_routing, **flags)
    return served.store, served


def destination(served: Served) -> Destination:
    info = served.info()
    assert info is not None
    picked = info.pick()
    assert isinstance(picked, Balanced)
    return picked.destination


def test_one_preparation_serves_every_request_until_something_it_depends_on_changes() -> None:
    store, served = table(apiservice(), service())
    info = served.info()
    assert info is not None
    assert (info.apiservice.name, info.transport_error) == (NAME, None)
    assert served.info() is info  # prepared once, read many times
    assert destination(served) is destination(served)  # the very object, nothing rebuilt
    assert (destination(served).host, destination(served).port) == ("10.0.0.5", 443)

    store.upsert(service(namespace="elsewhere"))  # another Service: nothing of this APIService moved
    assert served.info() is info

    store.upsert(service(cluster_ip="10.0.0.6"))  # its Service: prepared again at once
    moved = served.info()
    assert moved is not info and destination(served).host == "10.0.0.6"

    store.upsert(apiservice(version_priority=20))  # the APIService itself
    assert served.info() is not moved


def test_a_new_front_proxy_client_certificate_prepares_everything_again(pki: PKI) -> None:
    stem = "proxy-client-rotating"
    write_pair(pki.dir, stem, issue_client_cert(load_pair(pki.dir, "front-proxy-ca"), "front-proxy"))
    served = Served(
        apiservice(),
        service(),
        proxy_client_cert_file=pki.path(f"{stem}.crt"),
        proxy_client_key_file=pki.path(f"{stem}.key"),
    )
    info = served.info()
    assert info is not None
    write_pair(pki.dir, stem, issue_client_cert(load_pair(pki.dir, "front-proxy-ca"), "front-proxy"))
    served.backends.client_certificate.reload()  # what the file watch does
    again = served.info()
    assert again is not None and again is not info
    assert again.backend is not info.backend  # new connections present the new certificate


def test_local_and_vanished_apiservices_have_no_handling_info() -> None:
    store, served = table(apiservice(service=None), service())
    assert served.info() is None
    store.upsert(apiservice())
    assert served.info() is not None
    store.delete(Kind.APISERVICE, "", NAME)
    assert served.info() is None


def test_an_unresolvable_service_is_an_error_picked_per_request() -> None:
    store, served = table(apiservice())  # no Service object
    info = served.info()
    assert info is not None
    with pytest.raises(BackendError) as failed:
        info.pick()
    assert (failed.value.hop, failed.value.cause) == (Hop.SERVICE, 'service "api" not found')
    store.upsert(service())  # the Service appears: the next request resolves
    assert destination(served).host == "10.0.0.5"


def test_endpoint_routing_picks_among_the_ready_endpoints_only() -> None:
    store, served = table(
        apiservice(),
        service(),
        endpoints(("10.1.0.1", True), ("10.1.0.2", False), ("10.1.0.3", None)),
        endpoint_routing=True,
    )
    info = served.info()
    assert info is not None
    picked: set[str] = set()
    for _ in range(200):
        pick = info.pick()
        assert isinstance(pick, Balanced)  # endpoints, not an ExternalName still to look up
        picked.add(pick.destination.host)
    assert picked == {"10.1.0.1", "10.1.0.3"}
    store.upsert(endpoints(("10.1.0.9", True)))  # the slice changes: so does where requests go
    assert {destination(served).host} == {"10.1.0.9"}


def test_an_external_name_is_looked_up_per_request_and_its_destinations_kept() -> None:
    _, served = table(
        apiservice(),
        service(type="ExternalName", external_name="api.example.net"),
        allow_external_name_services=True,
    )
    info = served.info()
    assert info is not None
    pending = info.pick()
    assert isinstance(pending, PendingLookup) and pending.host == "api.example.net"
