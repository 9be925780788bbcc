"""Upstream's service resolution, over store objects; and the SSRF guards (S6)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.backends.addresses import AddressResolver, PendingLookup, Target
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.options import DEFAULT_DENY_CIDRS
from aggregator.config import complete
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.objects import Endpoint, EndpointPort, EndpointSlice, Service, ServicePort
from aggregator.sources.store import Store
from tests.conftest import StartGateway
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    force_available,
    service_manifest,
    status_of,
    write_manifests,
)
from tests.support.fakekube import FakeKube, kube_options
from tests.support.gateway import running_gateway
from tests.support.options import flag_options
from tests.support.pki import PKI
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"


def apiservice(port: int = 443) -> APIService:
    return APIService(
        name="v1.demo.example.com",
        group="demo.example.com",
        version="v1",
        service=ServiceReference("demo", "api", port),
        group_priority_minimum=1000,
        version_priority=15,
    )


def store_with(*objs: Service | EndpointSlice) -> Store:
    store = Store()
    for obj in objs:
        store.upsert(obj)
    return store


def service(**kw: Any) -> Service:
    base: dict[str, Any] = {
        "namespace": "demo",
        "name": "api",
        "cluster_ip": "10.0.0.5",
        "ports": (ServicePort("https", 443, 8443),),
    }
    base.update(kw)
    return Service(**base)


def failure(resolver: AddressResolver, svc: APIService | None = None) -> BackendError:
    with pytest.raises(BackendError) as info:
        resolver.resolve_now(svc or apiservice())
    return info.value


def test_cluster_ip_and_matching_service_port() -> None:
    resolver = AddressResolver(store_with(service()), deny_cidrs=DEFAULT_DENY_CIDRS)
    target = resolver.resolve_now(apiservice())
    assert target == Target("10.0.0.5", 443, "api.demo.svc")
    assert isinstance(target, Target)
    assert target.authority == "10.0.0.5:443"


def test_ipv6_cluster_ip_is_bracketed() -> None:
    target = AddressResolver(store_with(service(cluster_ip="fd00::5"))).resolve_now(apiservice())
    assert isinstance(target, Target)
    assert target.authority == "[fd00::5]:443"


@pytest.mark.parametrize(
    ("svc", "hop", "message"),
    [
        (None, Hop.SERVICE, 'service "api" not found'),
        (service(cluster_ip="None"), Hop.SERVICE, 'cannot route to service with ClusterIP "None"'),
        (
            service(ports=(ServicePort("https", 8443),)),
            Hop.PORT,
            'no service port 443 found for service "api"',
        ),
        (service(cluster_ip=""), Hop.SERVICE, 'service "api" has no cluster IP'),
        (service(type="Weird"), Hop.SERVICE, 'unsupported service type "Weird"'),
        (
            service(type="ExternalName", external_name="api.example.com"),
            Hop.SERVICE,
            'service "api" is of type ExternalName, which is refused unless --allow-external-name-services is set',
        ),
        (
            service(cluster_ip="169.254.169.254"),
            Hop.DENY_CIDR,
            "address 169.254.169.254 of service demo/api is in --backend-deny-cidrs range 169.254.0.0/16",
        ),
        (
            service(cluster_ip="fe80::1"),
            Hop.DENY_CIDR,
            "address fe80::1 of service demo/api is in --backend-deny-cidrs range fe80::/10",
        ),
        (
            service(cluster_ip="::ffff:169.254.169.254"),
            Hop.DENY_CIDR,
            "address ::ffff:169.254.169.254 of service demo/api is in --backend-deny-cidrs range 169.254.0.0/16",
        ),
    ],
    ids=[
        "missing",
        "headless",
        "no-port",
        "no-ip",
        "type",
        "external-name",
        "metadata",
        "link-local-v6",
        "mapped",
    ],
)
def test_cluster_resolution_failures_name_the_hop(svc: Service | None, hop: Hop, message: str) -> None:
    resolver = AddressResolver(store_with(svc) if svc else Store(), deny_cidrs=DEFAULT_DENY_CIDRS)
    err = failure(resolver)
    assert (err.hop, err.cause) == (hop, message)


def test_empty_deny_list_allows_link_local() -> None:
    target = AddressResolver(store_with(service(cluster_ip="169.254.1.1")), deny_cidrs=[]).resolve_now(
        apiservice()
    )
    assert isinstance(target, Target)


async def test_external_name_is_resolved_once_and_the_ip_pinned() -> None:
    """S6: a DNS answer that changes between check and dial cannot redirect the gateway."""
    answers = [["10.0.0.7"], ["169.254.169.254"]]
    lookups: list[str] = []

    async def lookup(host: str) -> list[str]:
        lookups.append(host)
        return answers.pop(0)

    store = store_with(service(type="ExternalName", external_name="api.example.com.", cluster_ip=""))
    resolver = AddressResolver(store, allow_external_name=True, deny_cidrs=DEFAULT_DENY_CIDRS, lookup=lookup)
    pending = resolver.resolve_now(apiservice())
    assert pending == PendingLookup("api.example.com", 443, "api.demo.svc", "demo/api")
    assert await resolver.resolve(apiservice()) == Target("10.0.0.7", 443, "api.demo.svc")
    assert lookups == ["api.example.com"]
    with pytest.raises(BackendError) as info:
        await resolver.resolve(apiservice())
    assert info.value.hop is Hop.DENY_CIDR
    assert "169.254.169.254" in info.value.cause and "ExternalName api.example.com" in info.value.cause
    assert lookups == ["api.example.com", "api.example.com"]


async def test_external_name_picks_the_first_allowed_address() -> None:
    async def lookup(_host: str) -> list[str]:
        return ["169.254.169.254", "10.0.0.9"]

    store = store_with(service(type="ExternalName", external_name="api.example.com", cluster_ip=""))
    resolver = AddressResolver(store, allow_external_name=True, deny_cidrs=DEFAULT_DENY_CIDRS, lookup=lookup)
    assert await resolver.resolve(apiservice()) == Target("10.0.0.9", 443, "api.demo.svc")


async def test_external_name_lookup_failure() -> None:
    async def lookup(_host: str) -> list[str]:
        raise OSError(-2, "Name or service not known")

    store = store_with(service(type="ExternalName", external_name="nowhere.invalid", cluster_ip=""))
    resolver = AddressResolver(store, allow_external_name=True, lookup=lookup)
    with pytest.raises(BackendError) as info:
        await resolver.resolve(apiservice())
    assert info.value.hop is Hop.CONNECT
    assert info.value.cause == "dial tcp: lookup nowhere.invalid: Name or service not known"


def endpoint_slice(
    name: str,
    endpoints: list[tuple[str, bool | None]],
    *,
    port: int = 8443,
    port_name: str | None = "https",
    address_type: str = "IPv4",
) -> EndpointSlice:
    return EndpointSlice(
        namespace="demo",
        name=name,
        service_name="api",
        address_type=address_type,
        ports=(EndpointPort(port_name, port),),
        endpoints=tuple(Endpoint((a,), r) for a, r in endpoints),
    )


def test_endpoint_routing_picks_ready_endpoints_from_a_random_start_with_the_target_port() -> None:
    store = store_with(
        service(),
        endpoint_slice(
            "a", [("10.1.0.1", True), ("10.1.0.2", False), ("10.1.0.3", None), ("10.1.0.4", True)]
        ),
    )
    resolver = AddressResolver(store, endpoint_routing=True, rng=random.Random(7))
    picks: Counter[str] = Counter()
    for _ in range(400):
        target = resolver.resolve_now(apiservice())
        assert isinstance(target, Target)
        assert target.port == 8443
        picks[target.ip] += 1
    assert set(picks) == {"10.1.0.1", "10.1.0.3", "10.1.0.4"}
    assert min(picks.values()) > 50


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        ([], 'no endpoints available for service "api"'),
        ([endpoint_slice("a", [("10.1.0.1", False)])], 'no endpoints available for service "api"'),
        (
            [endpoint_slice("a", [("10.1.0.1", True)], port_name="metrics")],
            'no endpoints available for service "api"',
        ),
        ([endpoint_slice("a", [])], 'no endpoints available for service "api"'),
    ],
    ids=["no-slices", "none-ready", "port-name-mismatch", "empty"],
)
def test_endpoint_routing_failures(slices: list[EndpointSlice], message: str) -> None:
    resolver = AddressResolver(store_with(service(), *slices), endpoint_routing=True)
    err = failure(resolver)
    assert (err.hop, err.cause) == (Hop.ENDPOINTS, message)


def test_endpoint_routing_moves_on_to_a_slice_with_a_ready_endpoint_and_prefers_the_service_family() -> None:
    store = store_with(
        service(),
        endpoint_slice("v6", [("fd00::1", True)], address_type="IPv6"),
        endpoint_slice("dead", [("10.1.0.1", False)]),
        endpoint_slice("live", [("10.1.0.9", True)]),
    )
    resolver = AddressResolver(store, endpoint_routing=True)
    for _ in range(50):
        target = resolver.resolve_now(apiservice())
        assert isinstance(target, Target)
        assert target.ip == "10.1.0.9"


def test_endpoint_routing_refuses_external_name_and_denied_endpoints() -> None:
    resolver = AddressResolver(
        store_with(service(type="ExternalName", external_name="x")),
        endpoint_routing=True,
        allow_external_name=True,
    )
    assert failure(resolver).cause == 'unsupported service type "ExternalName"'
    store = store_with(service(), endpoint_slice("a", [("169.254.169.254", True)]))
    err = failure(AddressResolver(store, endpoint_routing=True, deny_cidrs=DEFAULT_DENY_CIDRS))
    assert err.hop is Hop.DENY_CIDR


# --- over real TLS: unspecified addresses and the deny lists, against a running gateway -------------


@pytest.mark.parametrize("address", ["0.0.0.0", "0.1.2.3", "::", "::ffff:0.0.0.0", "::ffff:0.0.0.1"])
def test_unspecified_addresses_are_refused_whatever_the_deny_list(address: str) -> None:
    err = failure(AddressResolver(store_with(service(cluster_ip=address)), deny_cidrs=[]))
    assert err.hop is Hop.DENY_CIDR
    assert err.cause.startswith(f"address {address} of service demo/api is unspecified (")
    assert err.cause.endswith("dialing it reaches the gateway's own host, so it is never dialed")


def test_ipv4_mapped_loopback_is_caught_by_a_loopback_deny_list() -> None:
    store = store_with(service(cluster_ip="::ffff:127.0.0.1"))
    assert isinstance(AddressResolver(store, deny_cidrs=[]).resolve_now(apiservice()), Target)
    err = failure(AddressResolver(store, deny_cidrs=["127.0.0.0/8", "::1/128"]))
    assert (
        err.cause
        == "address ::ffff:127.0.0.1 of service demo/api is in --backend-deny-cidrs range 127.0.0.0/8"
    )


# The attack: a deny list that names loopback, and an address that reaches loopback anyway.
LOOPBACK_DENIED = ["127.0.0.0/8", "::1/128"]


@pytest.fixture
async def backend_v6(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[FakeBackend]:
    """A backend on ::1, which a dial of `::` reaches."""
    cert, key = backend_pki.serving("api-v6", [SERVER_NAME])
    fake = FakeBackend(cert, key, pki.path("front-proxy-ca.crt"), host="::1")
    await fake.start()
    yield fake
    await fake.stop()


@pytest.mark.parametrize(
    ("way", "address"),
    [
        ("cluster-ip", "0.0.0.0"),
        ("cluster-ip", "::ffff:0.0.0.0"),
        ("cluster-ip", "::"),
        ("endpoint", "0.0.0.0"),
        ("external-name", "0.0.0.0"),
        ("external-name", "::"),
    ],
)
@pytest.mark.parametrize("deny", [LOOPBACK_DENIED, []], ids=["loopback-denied", "empty-deny-list"])
async def test_unspecified_backend_addresses_are_never_dialed(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_v6: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    way: str,
    address: str,
    deny: list[str],
) -> None:
    """Service clusterIP, EndpointSlice address (--enable-aggregator-routing) or ExternalName answer:
    an unspecified address would reach the gateway's own host (here: the backend on loopback)."""
    target = backend_v6 if ":" in address and "ffff" not in address else backend
    port = target.port
    if way == "external-name":
        svc = service_manifest(port=port, type_="ExternalName", external_name="evil.example.test")
    else:
        svc = service_manifest(port=port, cluster_ip=address if way == "cluster-ip" else "10.96.0.10")
    slice_address = address if way == "endpoint" else "10.1.0.5"
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem),
        svc,
        endpointslice_manifest("api-1", [(slice_address, True)], port=port),
    )
    server = await start_gateway(
        backend_deny_cidrs=deny,
        enable_aggregator_routing=way == "endpoint",
        allow_external_name_services=way == "external-name",
    )

    async def lookup(_host: str) -> list[str]:
        return [address]

    server.gateway.backends.resolver.lookup = lookup
    checker = server.gateway.control.availability
    checker.poke(APISERVICE)
    await until(lambda: getattr(checker.verdict(APISERVICE), "reason", "") == "ForbiddenEndpoint")
    verdict = checker.verdict(APISERVICE)
    assert verdict is not None and verdict.status == "False"
    assert f"address {address} of service demo/api" in verdict.message
    assert "is unspecified (" in verdict.message and "[hop: deny-cidr" in verdict.message

    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 503
            assert status_of(await resp.read())["message"] == "service unavailable"
        force_available(server)  # the proxy's own check, without the availability verdict in front
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 503
            assert status_of(await resp.read())["message"] == "service unavailable"
    # Nothing reached the backend: no probe, no discovery or OpenAPI fetch, no proxied request.
    assert target.received == []


async def test_kube_mode_denies_loopback_by_default_and_local_mode_does_not(
    pki: PKI, fake_kube: FakeKube, backend: FakeBackend, backend_pki: BackendPKI, tmp_path: Path
) -> None:
    assert fake_kube.kubeconfig is not None
    def deny_cidrs(**flags: object) -> tuple[str, ...]:
        return complete(flag_options(**flags)).backends.deny_cidrs

    assert deny_cidrs(apiservices_dir=str(tmp_path)) == DEFAULT_DENY_CIDRS
    assert deny_cidrs(kubeconfig="k") == (*DEFAULT_DENY_CIDRS, "127.0.0.0/8", "::1/128")
    assert deny_cidrs(kubeconfig="k", backend_deny_cidrs=[]) == ()

    apiservice = apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem)
    del apiservice["status"]
    fake_kube.add_object("apiservices", apiservice)
    fake_kube.add_object("services", service_manifest(port=backend.port))  # cluster IP 127.0.0.1
    fake_kube.add_object(
        "endpointslices", endpointslice_manifest("api-1", [("127.0.0.1", True)], port=backend.port)
    )
    options = kube_options(pki, fake_kube.kubeconfig, backend_deny_cidrs=None)
    async with running_gateway(options) as server:
        checker = server.gateway.control.availability
        await until(lambda: getattr(checker.verdict(APISERVICE), "reason", "") == "ForbiddenEndpoint")
        verdict = checker.verdict(APISERVICE)
        assert verdict is not None
        assert "address 127.0.0.1 of service demo/api is in --backend-deny-cidrs range 127.0.0.0/8" in (
            verdict.message
        )
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + THINGS, ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 503
    assert backend.received == []
