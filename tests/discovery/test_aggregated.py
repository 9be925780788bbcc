"""Aggregated discovery: conversion, merge order, ETag, and the document served over TLS."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest

from aggregator.discovery.aggregated import (
    STALE,
    ConversionError,
    VersionEntry,
    convert_resource_list,
    load_builtin_priorities,
    merge_items,
    normalize_resource,
    registration_entry,
    render,
)
from aggregator.discovery.component import Discovery
from aggregator.discovery.fetcher import is_aggregated_content_type
from aggregator.runners.server import GatewayServer
from aggregator.wire.jsonenc import go_marshal
from tests.conftest import StartGateway
from tests.discovery.fakes import (
    AGG_TYPE,
    FakeBackends,
    FakeResponse,
    Unreachable,
    hang,
    resource,
    serve_aggregated,
    serve_legacy,
)
from tests.discovery.manifests import apiservice, write_manifests
from tests.support.pki import PKI
from tests.support.polling import until

V2 = AGG_TYPE
V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


def test_convert_legacy_resource_list() -> None:
    converted = convert_resource_list(
        [
            {
                "name": "flunders",
                "singularName": "flunder",
                "namespaced": True,
                "kind": "Flunder",
                "verbs": ["get", "list"],
                "shortNames": ["fl"],
                "categories": ["all"],
            },
            {
                "name": "flunders/status",
                "singularName": "",
                "namespaced": True,
                "kind": "Flunder",
                "verbs": ["get", "patch"],
            },
            {
                "name": "flunders/scale",
                "namespaced": True,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get"],
            },
            {"name": "orphans/log", "namespaced": False, "kind": "", "verbs": ["get"]},
        ]
    )
    assert go_marshal(converted) == (
        b'[{"resource":"flunders","responseKind":{"group":"","version":"","kind":"Flunder"},"scope":"Namespaced",'
        b'"singularResource":"flunder","verbs":["get","list"],"shortNames":["fl"],"categories":["all"],"subresources":['
        b'{"subresource":"status","responseKind":{"group":"","version":"","kind":"Flunder"},"verbs":["get","patch"]},'
        b'{"subresource":"scale","responseKind":{"group":"autoscaling","version":"v1","kind":"Scale"},"verbs":["get"]}]},'
        b'{"resource":"orphans","responseKind":{"group":"","version":"","kind":""},"scope":"Cluster","singularResource":"",'
        b'"verbs":null,"subresources":[{"subresource":"log","responseKind":{"group":"","version":"","kind":""},"verbs":["get"]}]}]'
    )


def test_scope_mismatch_fails_the_whole_group_version() -> None:
    with pytest.raises(ConversionError) as err:
        convert_resource_list(
            [
                {"name": "things", "namespaced": True, "kind": "Thing"},
                {"name": "things/status", "namespaced": False, "kind": "Thing"},
            ]
        )
    assert (
        str(err.value)
        == "Error: Parent things (scope: Namespaced) and subresource status (scope: Cluster) scope do not match"
    )


def test_normalize_fixes_nil_response_kind_and_drops_unknown_fields() -> None:
    got = normalize_resource(
        {
            "verbs": ["get"],
            "scope": "Cluster",
            "resource": "x",
            "extra": 1,
            "subresources": [{"subresource": "s", "verbs": None}],
        }
    )
    assert go_marshal(got) == (
        b'{"resource":"x","responseKind":{"group":"","version":"","kind":""},"scope":"Cluster","singularResource":"",'
        b'"verbs":["get"],"subresources":[{"subresource":"s","responseKind":{"group":"","version":"","kind":""},"verbs":null}]}'
    )


def test_merge_orders_groups_by_priority_then_group_name() -> None:
    entries = [
        VersionEntry("b.example.com", "v1", 100, 10, None, STALE),
        VersionEntry("a.example.com", "v2", 100, 10, (resource("as", "A"),)),
        VersionEntry("m.example.com", "v1beta1", 50, 20, None),
        VersionEntry("m.example.com", "v1", 40, 20, None),
        VersionEntry("m.example.com", "v2alpha1", 50, 30, None),
        registration_entry(),
    ]
    items = merge_items(entries)
    assert [i["metadata"]["name"] for i in items] == [
        "apiregistration.k8s.io",
        "a.example.com",
        "b.example.com",
        "m.example.com",
    ]
    assert [v["version"] for v in items[3]["versions"]] == ["v2alpha1", "v1", "v1beta1"]
    assert items[2]["versions"] == [{"version": "v1", "freshness": "Stale"}]


def test_etag_is_upstreams_hash_of_the_list_without_type_meta() -> None:
    items = merge_items([VersionEntry("a.example.com", "v1", 100, 10, None, STALE)])
    rendered = render(items)
    expected = b'{"metadata":{},"items":[{"metadata":{"name":"a.example.com"},"versions":[{"version":"v1","freshness":"Stale"}]}]}'
    assert rendered["v2"].etag == '"' + hashlib.sha512(expected).hexdigest().upper() + '"'
    assert rendered["v2beta1"].etag == rendered["v2"].etag
    assert rendered["v2"].json == (
        b'{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":'
        b'[{"metadata":{"name":"a.example.com"},"versions":[{"version":"v1","freshness":"Stale"}]}]}\n'
    )
    assert rendered["v2beta1"].json.startswith(
        b'{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2beta1",'
    )
    assert render([])["v2"].json.endswith(b'"items":[]}\n')


def test_priority_table_merges_kube_over_generic() -> None:
    table = load_builtin_priorities()
    assert table["v1"] == (18000, 1)
    assert table["apps/v1"] == (17800, 15)
    assert table["autoscaling/v2"] == (17500, 30)
    assert table["resource.k8s.io/v1alpha3"] == (16200, 1)  # the kube table overrides the generic 15900/9
    assert table["flowcontrol.apiserver.k8s.io/v1"] == (16100, 21)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (V2, True),
        (V2BETA1, True),
        ("application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io; x=1", True),
        ("application/json", False),
        ("application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList", False),
        ("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList", False),
        (None, False),
    ],
)
def test_aggregated_content_type(value: str | None, ok: bool) -> None:
    assert is_aggregated_content_type(value) is ok


# --- over TLS, with fake backends behind the transport seam ----------------------------------------------


def discovery_of(server: GatewayServer, fakes: FakeBackends) -> Discovery:
    discovery = server.gateway.control.discovery
    discovery.fetcher.backends = fakes
    # The availability checker dials the real (absent) backends the fakes stand in for: its
    # verdicts say nothing about the fakes.
    discovery.fetcher.reachability = None
    fetcher = discovery.fetcher
    fetcher.backoff_initial, fetcher.backoff_max, fetcher.timeout = 0.02, 0.1, 0.3
    for name in list(fetcher.states):
        fetcher.poke(name)
    return discovery


async def get_aggregated(
    session: aiohttp.ClientSession, server: GatewayServer, pki: PKI, accept: str = V2
) -> tuple[aiohttp.ClientResponse, bytes]:
    async with session.get(
        server.url + "/apis", ssl=pki.client_context(), headers={"Accept": accept}
    ) as resp:
        return resp, await resp.read()


async def test_aggregated_document_over_tls(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(
        apiservices_dir,
        [
            apiservice("v1alpha1.wardle.example.com", 1000, 15, service=("wardle", "api")),
            apiservice("v1beta1.wardle.example.com", 1000, 20, service=("wardle", "api")),
            apiservice("v1.legacy.example.com", 1000, 15, service=("legacy", "api")),
            apiservice("v1.apps", 17800, 15, service=None),  # local: nothing behind it in local mode
        ],
    )
    server = await start_gateway()
    fakes = FakeBackends()
    wardle = {
        "wardle.example.com": {
            "v1alpha1": [resource("flunders", "Flunder", short=["fl"])],
            "v1beta1": [resource("fischers", "Fischer", scope="Cluster")],
        }
    }
    fakes.handlers["v1alpha1.wardle.example.com"] = serve_aggregated(wardle)
    fakes.handlers["v1beta1.wardle.example.com"] = serve_aggregated(wardle)
    legacy_res = [
        {"name": "widgets", "singularName": "widget", "namespaced": True, "kind": "Widget", "verbs": ["get"]}
    ]
    fakes.handlers["v1.legacy.example.com"] = serve_legacy("legacy.example.com", "v1", legacy_res)
    discovery = discovery_of(server, fakes)
    await until(lambda: all(s.fresh for s in discovery.fetcher.states.values()))

    async with aiohttp.ClientSession() as session:
        resp, body = await get_aggregated(session, server, pki)
        assert resp.status == 200
        assert resp.headers["Content-Type"] == V2
        assert resp.headers["Vary"] == "Accept" and resp.headers["Cache-Control"] == "public"
        etag = resp.headers["ETag"]
        doc = json.loads(body)
        assert body.endswith(b"}\n")
        assert [i["metadata"]["name"] for i in doc["items"]] == [
            "apiregistration.k8s.io",
            "legacy.example.com",
            "wardle.example.com",
        ]
        assert doc["items"][0]["versions"][0]["resources"][0]["resource"] == "apiservices"
        wardle_versions = doc["items"][2]["versions"]
        assert [v["version"] for v in wardle_versions] == ["v1beta1", "v1alpha1"]
        assert wardle_versions[1]["resources"][0]["shortNames"] == ["fl"]
        assert all(v["freshness"] == "Current" for v in wardle_versions)
        assert doc["items"][1]["versions"][0]["resources"][0]["responseKind"]["kind"] == "Widget"
        hashed = go_marshal({"metadata": {}, "items": doc["items"]})
        assert etag == '"' + hashlib.sha512(hashed).hexdigest().upper() + '"'

        async with session.get(
            server.url + "/apis", ssl=pki.client_context(), headers={"Accept": V2, "If-None-Match": etag}
        ) as r304:
            assert r304.status == 304 and await r304.read() == b""
            assert r304.headers["ETag"] == etag and r304.headers["Vary"] == "Accept"
        resp, body = await get_aggregated(
            session, server, pki, f"application/json,{V2}"
        )  # plain listed first
        assert resp.headers["Content-Type"] == V2
        resp, body = await get_aggregated(session, server, pki, V2BETA1)
        assert resp.headers["Content-Type"] == V2BETA1
        assert json.loads(body)["apiVersion"] == "apidiscovery.k8s.io/v2beta1"
        resp, body = await get_aggregated(
            session,
            server,
            pki,
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        assert resp.headers["Content-Type"] == "application/json"  # no protobuf: legacy JSON
        assert json.loads(body)["kind"] == "APIGroupList"
        resp, body = await get_aggregated(
            session, server, pki, V2.replace("application/json", "application/yaml")
        )
        assert resp.headers["Content-Type"] == V2.replace("application/json", "application/yaml")
        assert body.startswith(b"apiVersion: apidiscovery.k8s.io/v2\nitems:\n")
        async with session.get(
            server.url + "/apis/", ssl=pki.client_context(), headers={"Accept": V2}
        ) as legacy_only:
            assert legacy_only.status == 406  # /apis/ is legacy only, as upstream

    # the gateway asked as itself, with the aggregated Accept, and revalidated with the ETag it got
    calls = [c for c in fakes.calls if c[0] == "v1alpha1.wardle.example.com"]
    assert calls[0][2]["Accept"].startswith(V2) and calls[0][3].name == "system:kube-aggregator"
    assert calls[0][3].groups == ("system:masters",)
    legacy_calls = [c for c in fakes.calls if c[0] == "v1.legacy.example.com"]
    assert [c[1] for c in legacy_calls[:2]] == ["/apis", "/apis/legacy.example.com/v1"]
    assert legacy_calls[1][3].groups == ()


async def test_dead_backend_stays_listed_stale_and_apis_does_not_wait(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(
        apiservices_dir,
        [apiservice("v1.up.example.com", 1000, 15), apiservice("v1.never.example.com", 1000, 15)],
    )
    server = await start_gateway()
    fakes = FakeBackends()
    fakes.handlers["v1.up.example.com"] = serve_aggregated(
        {"up.example.com": {"v1": [resource("things", "Thing")]}}
    )
    fakes.handlers["v1.never.example.com"] = lambda _p, _h: Unreachable("connect", "connection refused")
    discovery = discovery_of(server, fakes)
    up = discovery.fetcher.states["v1.up.example.com"]
    await until(lambda: up.fresh)

    # the backend dies: first 503, then it hangs
    fakes.handlers["v1.up.example.com"] = lambda _p, _h: FakeResponse(503)
    discovery.fetcher.poke("v1.up.example.com")
    await until(lambda: not up.fresh)
    assert "returned non-success response code: 503" in up.last_error
    hanging = asyncio.Event()

    async def hang_noted(path: str, headers: Mapping[str, str]) -> FakeResponse:
        hanging.set()
        return await hang(path, headers)

    fakes.handlers["v1.up.example.com"] = hang_noted
    discovery.fetcher.poke("v1.up.example.com")
    await asyncio.wait_for(hanging.wait(), 10)

    # the fetch in flight hangs for an hour: any answer at all comes from the rendered document
    async with aiohttp.ClientSession() as session:
        resp, body = await asyncio.wait_for(get_aggregated(session, server, pki), 10)
    assert resp.status == 200
    items = {i["metadata"]["name"]: i["versions"] for i in json.loads(body)["items"]}
    assert items["up.example.com"] == [
        {"version": "v1", "resources": [resource("things", "Thing")], "freshness": "Stale"}
    ]
    assert items["never.example.com"] == [{"version": "v1", "freshness": "Stale"}]
    metrics = server.gateway.metrics
    assert (
        metrics.registry.get_sample_value(
            "aggregator_discovery_fetches_total", {"apiservice": "v1.up.example.com", "result": "aggregated"}
        )
        == 1
    )
    errors = metrics.registry.get_sample_value(
        "aggregator_discovery_fetches_total", {"apiservice": "v1.up.example.com", "result": "error"}
    )
    assert errors is not None and errors >= 1
    aggregations = metrics.registry.get_sample_value("aggregator_discovery_aggregation_count_total")
    assert aggregations is not None and aggregations >= 2


def test_a_render_assembled_from_cached_groups_equals_encoding_the_whole_document() -> None:
    from aggregator.discovery.aggregated import AggregatedDiscovery
    from aggregator.wire.jsonenc import encode_object, go_marshal
    from aggregator.wire.rendered import quoted_sha512

    entries = [
        VersionEntry("b.example.com", "v1", 100, 10, (resource("bees", "Bee"),)),
        VersionEntry("a.example.com", "v1beta1", 200, 5, (resource("ants", "Ant <&>"),), STALE),
        VersionEntry("a.example.com", "v1", 200, 15, None),
    ]
    current = list(entries)
    discovery = AggregatedDiscovery(lambda: current)
    for change in range(3):
        for version in ("v2", "v2beta1"):
            doc = discovery.document(version)
            whole = {
                "kind": "APIGroupDiscoveryList",
                "apiVersion": f"apidiscovery.k8s.io/{version}",
                "metadata": {},
                "items": merge_items(current),
            }
            assert doc.json == encode_object(whole)
            assert doc.etag == quoted_sha512(go_marshal({"metadata": {}, "items": merge_items(current)}))
        # one group changes, the other is joined from its cached fragment
        current[0] = VersionEntry("b.example.com", "v1", 100, 10, (resource(f"bees{change}", "Bee"),))
        discovery.invalidate()
