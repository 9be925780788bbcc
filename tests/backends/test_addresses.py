"""Upstream's service resolution, over store objects; and the SSRF guards (S6)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from aggregator.backends.addresses import AddressResolver, PendingLookup, Target
from aggregator.backends.errors import BackendError, Hop
from aggregator.config import DEFAULT_DENY_CIDRS
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.objects import Endpoint, EndpointPort, EndpointSlice, Service, ServicePort
from aggregator.sources.store import Store


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


def service(**kw: object) -> Service:
    base: dict[str, object] = {
        "namespace": "demo",
        "name": "api",
        "cluster_ip": "10.0.0.5",
        "ports": (ServicePort("https", 443, 8443),),
    }
    base.update(kw)
    return Service(**base)  # type: ignore[arg-type]


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
    # Cached until the Service object changes.
    assert resolver.resolve_now(apiservice()) is target


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
    target = AddressResolver(store_with(service(cluster_ip="169.254.1.1")), deny_cidrs=[]).resolve_now(apiservice())
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
    picks = Counter()
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
