"""Legacy discovery: `/apis` and `/apis/<group>` byte for byte as kube-aggregator serves them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from aggregator.discovery.legacy import LegacyDiscovery, group_document, group_list_document
from aggregator.model.apiservice import decode_apiservice
from aggregator.sources.store import Store
from tests.conftest import StartGateway
from tests.discovery.manifests import apiservice, write_manifests
from tests.support.pki import PKI
from tests.support.polling import until

FIXTURE = [
    apiservice("v1.", 18000, 1, service=None),  # the core group: never listed
    apiservice("v1.apps", 17800, 15, service=None),
    apiservice("v1beta1.metrics.k8s.io", 100, 100, service=("kube-system", "metrics-server")),
    apiservice("v2.a.example.com", 100, 10),
    apiservice("v1.b.example.com", 100, 10),
    apiservice("v1beta1.multi.example.com", 50, 20),
    apiservice("v1.multi.example.com", 40, 20),
    apiservice("v2alpha1.multi.example.com", 50, 30),
]

REGISTRATION = (
    '{"name":"apiregistration.k8s.io","versions":[{"groupVersion":"apiregistration.k8s.io/v1","version":"v1"}],'
    '"preferredVersion":{"groupVersion":"apiregistration.k8s.io/v1","version":"v1"}}'
)
GROUP_A = (
    '{"name":"a.example.com","versions":[{"groupVersion":"a.example.com/v2","version":"v2"}],'
    '"preferredVersion":{"groupVersion":"a.example.com/v2","version":"v2"}}'
)
GROUP_MULTI = (
    '{"name":"multi.example.com","versions":['
    '{"groupVersion":"multi.example.com/v2alpha1","version":"v2alpha1"},'
    '{"groupVersion":"multi.example.com/v1","version":"v1"},'
    '{"groupVersion":"multi.example.com/v1beta1","version":"v1beta1"}],'
    '"preferredVersion":{"groupVersion":"multi.example.com/v2alpha1","version":"v2alpha1"}}'
)
EXPECTED_APIS = (
    '{"kind":"APIGroupList","apiVersion":"v1","groups":['
    + REGISTRATION
    + ',{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],'
    '"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}'
    # gpm 100 three ways: APIService names v1.b... < v1beta1.metrics... < v2.a... (not group names)
    ',{"name":"b.example.com","versions":[{"groupVersion":"b.example.com/v1","version":"v1"}],'
    '"preferredVersion":{"groupVersion":"b.example.com/v1","version":"v1"}}'
    ',{"name":"metrics.k8s.io","versions":[{"groupVersion":"metrics.k8s.io/v1beta1","version":"v1beta1"}],'
    '"preferredVersion":{"groupVersion":"metrics.k8s.io/v1beta1","version":"v1beta1"}}'
    "," + GROUP_A + "," + GROUP_MULTI + "]}\n"
).encode()


def test_documents_from_apiservices() -> None:
    services = [decode_apiservice(doc) for doc in FIXTURE]
    assert json.dumps(group_list_document(services), separators=(",", ":")).encode() + b"\n" == EXPECTED_APIS
    multi = [s for s in services if s.group == "multi.example.com"]
    assert group_document(multi) == {"kind": "APIGroup", "apiVersion": "v1", **json.loads(GROUP_MULTI)}


def test_empty_registry_lists_only_apiregistration() -> None:
    assert group_list_document([]) == {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [json.loads(REGISTRATION)],
    }


async def test_apis_and_group_over_tls_byte_for_byte(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(apiservices_dir, FIXTURE)
    server = await start_gateway()
    ssl = pki.client_context()
    async with aiohttp.ClientSession() as session:
        for path in ("/apis", "/apis/"):
            async with session.get(server.url + path, ssl=ssl) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == "application/json"
                assert await resp.read() == EXPECTED_APIS
                etag = resp.headers["ETag"]
        async with session.get(server.url + "/apis", ssl=ssl, headers={"If-None-Match": etag}) as resp:
            assert resp.status == 304
            assert await resp.read() == b""
            assert resp.headers["ETag"] == etag

        for path in ("/apis/multi.example.com", "/apis/multi.example.com/"):
            async with session.get(server.url + path, ssl=ssl) as resp:
                assert resp.status == 200
                body = await resp.read()
        assert body == ('{"kind":"APIGroup","apiVersion":"v1",' + GROUP_MULTI[1:] + "\n").encode()
        async with session.get(server.url + "/apis/a.example.com", ssl=ssl) as resp:
            assert (
                await resp.read() == ('{"kind":"APIGroup","apiVersion":"v1",' + GROUP_A[1:] + "\n").encode()
            )

        # an unknown group is the local-mode fallback: upstream's 404 Status
        async with session.get(server.url + "/apis/missing.example.com", ssl=ssl) as resp:
            assert resp.status == 404
            assert (await resp.json())["reason"] == "NotFound"
        # the core group is not a group path
        async with session.get(server.url + "/apis/v1", ssl=ssl) as resp:
            assert resp.status == 404


async def test_negotiation_and_pretty_printing(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(apiservices_dir, [apiservice("v1.a.example.com", 100, 10)])
    server = await start_gateway()
    ssl = pki.client_context()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/apis", ssl=ssl, headers={"Accept": "application/yaml"}) as resp:
            assert resp.headers["Content-Type"] == "application/yaml"
            assert (await resp.text()).startswith("apiVersion: v1\ngroups:\n- name: apiregistration.k8s.io\n")
        async with session.get(server.url + "/apis", ssl=ssl, headers={"User-Agent": "curl/8.5.0"}) as resp:
            text = await resp.text()
            assert text.startswith('{\n  "kind": "APIGroupList",\n  "apiVersion": "v1",\n  "groups": [\n')
            assert text.endswith("}") and not text.endswith("\n")
        async with session.get(server.url + "/apis/a.example.com?pretty=true", ssl=ssl) as resp:
            assert (await resp.text()).startswith('{\n  "kind": "APIGroup",')
        # a conversion request is refused by legacy endpoints; nothing else acceptable -> upstream's 406
        accept = "application/json;as=Table;v=v1;g=meta.k8s.io"
        async with session.get(
            server.url + "/apis/a.example.com", ssl=ssl, headers={"Accept": accept}
        ) as resp:
            assert resp.status == 406
            assert resp.headers["Content-Type"] == "application/json"
            assert await resp.read() == (
                b'{\n  "kind": "Status",\n  "apiVersion": "v1",\n  "metadata": {},\n  "status": "Failure",\n'
                b'  "message": "only the following media types are accepted: application/json, application/yaml, '
                b'application/vnd.kubernetes.protobuf",\n  "reason": "NotAcceptable",\n  "code": 406\n}'
            )
        # protobuf preferred, JSON acceptable: JSON
        accept = "application/vnd.kubernetes.protobuf, application/json"
        async with session.get(server.url + "/apis", ssl=ssl, headers={"Accept": accept}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"


async def test_documents_follow_folder_changes(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(apiservices_dir, [apiservice("v1.a.example.com", 100, 10)])
    server = await start_gateway()
    ssl = pki.client_context()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/apis", ssl=ssl) as resp:
            first_etag = resp.headers["ETag"]
        write_manifests(
            apiservices_dir, [apiservice("v1.a.example.com", 100, 10), apiservice("v1.c.example.com", 200, 1)]
        )
        source = server.gateway.control.folder
        assert source is not None
        source.reload()
        async with session.get(server.url + "/apis", ssl=ssl, headers={"If-None-Match": first_etag}) as resp:
            assert resp.status == 200
            names = [g["name"] for g in (await resp.json())["groups"]]
        assert names == ["apiregistration.k8s.io", "c.example.com", "a.example.com"]
        async with session.get(server.url + "/apis/c.example.com", ssl=ssl) as resp:
            assert resp.status == 200


async def test_the_list_is_rendered_ahead_only_once_someone_reads_it() -> None:
    """The control process of `--workers N` serves nothing: rendering 5000 groups there on every
    change only held up its event loop (the new APIService's first check waited behind it)."""
    store = Store()
    legacy = LegacyDiscovery(store, interval=0.0)
    store.add_listener(legacy.on_store_event)
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    store.upsert(decode_apiservice(apiservice("v1.b.example.com", 100, 10)))
    await asyncio.sleep(0.05)  # a turn of the loop for anything scheduled ahead (nothing is)
    assert legacy.rebuilds == 0
    names = [g["name"] for g in json.loads(legacy.group_list().json)["groups"]]
    assert names == ["apiregistration.k8s.io", "a.example.com", "b.example.com"]
    assert legacy.rebuilds == 1
    store.upsert(decode_apiservice(apiservice("v1.c.example.com", 200, 1)))
    await until(lambda: legacy.rebuilds == 2, what="the list rendered ahead of the next read")
    names = [g["name"] for g in json.loads(legacy.group_list().json)["groups"]]
    assert names == ["apiregistration.k8s.io", "c.example.com", "a.example.com", "b.example.com"]
    assert legacy.rebuilds == 2
