"""Local mode publishes OpenAPI for the group-version it serves itself: apiregistration.k8s.io/v1.

What kubectl reads from it (explain, server-side validation) is checked with the real binaries in
`tests/e2e/test_openapi.py`; here: the documents are whole (every `$ref` resolves), carry
upstream's kinds and the operations the resource has, are served as they are built, win over any
backend's claim to the group, and are not published in kube mode (kube-apiserver's are).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from aggregator.openapi.local import KEY, build_documents
from aggregator.openapi.merge import _refs
from aggregator.runners.server import GatewayServer
from aggregator.wire.jsonenc import go_marshal
from tests.conftest import StartGateway
from tests.openapi.conftest import StartBackend
from tests.openapi.support import fast, register, sha512_upper, v2_paths, v3_document
from tests.support.backend import BackendPKI
from tests.support.fakekube import FakeKube, kube_options
from tests.support.fakereviews import FakeReviews
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

TYPES = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1."


async def get(server: GatewayServer, pki: PKI, path: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            server.url + path, ssl=pki.client_context(), headers={"Accept": "application/json"}
        ) as resp,
    ):
        return resp.status, await resp.read()


def test_documents_are_whole_and_carry_upstreams_kinds() -> None:
    v3, v2 = build_documents()
    schemas, definitions = v3["components"]["schemas"], v2["definitions"]
    for doc, prefix, names in ((v3, "#/components/schemas/", schemas), (v2, "#/definitions/", definitions)):
        refs = set(_refs(doc))
        assert refs and all(r.startswith(prefix) for r in refs)
        assert {r[len(prefix) :] for r in refs} <= set(names)  # nothing dangles
    assert set(schemas) == set(definitions)
    api_service = schemas[TYPES + "APIService"]
    assert api_service["x-kubernetes-group-version-kind"] == [
        {"group": "apiregistration.k8s.io", "kind": "APIService", "version": "v1"}
    ]
    assert schemas[TYPES + "APIServiceList"]["x-kubernetes-group-version-kind"][0]["kind"] == "APIServiceList"
    assert api_service["properties"]["spec"] == {
        "allOf": [{"$ref": f"#/components/schemas/{TYPES}APIServiceSpec"}],
        "default": {},
        "description": "Spec contains information for locating and communicating with a server",
    }
    # v2 form: the reference itself, as kube-apiserver's swagger.json has it
    assert definitions[TYPES + "APIService"]["properties"]["spec"] == {
        "$ref": f"#/definitions/{TYPES}APIServiceSpec",
        "description": "Spec contains information for locating and communicating with a server",
    }
    spec = schemas[TYPES + "APIServiceSpec"]
    assert spec["required"] == ["groupPriorityMinimum", "versionPriority"]
    assert spec["properties"]["caBundle"]["format"] == "byte"
    conditions = schemas[TYPES + "APIServiceStatus"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["x-kubernetes-patch-strategy"] == "merge"

    paths = v3["paths"]
    prefix = "/apis/apiregistration.k8s.io/v1"
    assert sorted(paths) == [
        f"{prefix}/",
        f"{prefix}/apiservices",
        f"{prefix}/apiservices/{{name}}",
        f"{prefix}/apiservices/{{name}}/status",
        f"{prefix}/watch/apiservices",
        f"{prefix}/watch/apiservices/{{name}}",
    ]
    operations = {
        op["operationId"]: (method, op.get("x-kubernetes-action"))
        for item in paths.values()
        for method, op in item.items()
        if method != "parameters"
    }
    assert operations == {
        "getApiregistrationV1APIResources": ("get", None),
        "deleteApiregistrationV1CollectionAPIService": ("delete", "deletecollection"),
        "listApiregistrationV1APIService": ("get", "list"),
        "createApiregistrationV1APIService": ("post", "post"),
        "deleteApiregistrationV1APIService": ("delete", "delete"),
        "readApiregistrationV1APIService": ("get", "get"),
        "patchApiregistrationV1APIService": ("patch", "patch"),
        "replaceApiregistrationV1APIService": ("put", "put"),
        "readApiregistrationV1APIServiceStatus": ("get", "get"),
        "patchApiregistrationV1APIServiceStatus": ("patch", "patch"),
        "replaceApiregistrationV1APIServiceStatus": ("put", "put"),
        "watchApiregistrationV1APIServiceList": ("get", "watchlist"),
        "watchApiregistrationV1APIService": ("get", "watch"),
    }
    patch = paths[f"{prefix}/apiservices/{{name}}"]["patch"]
    assert [p["name"] for p in patch["parameters"]] == ["dryRun", "fieldManager", "fieldValidation", "force"]
    watch_params = [p["name"] for p in paths[f"{prefix}/watch/apiservices"]["parameters"]]
    assert watch_params == sorted(watch_params) and "watch" in watch_params
    assert set(v2["paths"]) == set(paths)


async def test_served_in_local_mode_and_merged_into_v2(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    v3, v2 = build_documents()
    body = go_marshal(v3)
    status, index = await get(server, pki, "/openapi/v3")
    assert status == 200
    url = f"/openapi/v3/{KEY}?hash={sha512_upper(body)}"
    assert json.loads(index) == {"paths": {KEY: {"serverRelativeURL": url}}}
    assert await get(server, pki, url) == (200, body)
    status, merged = await get(server, pki, "/openapi/v2")
    doc: dict[str, Any] = json.loads(merged)
    assert status == 200 and doc["paths"] == v2["paths"] and doc["definitions"] == v2["definitions"]
    assert doc["securityDefinitions"] == v2["securityDefinitions"]


async def test_a_backend_cannot_replace_it(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    """An APIService for apiregistration.k8s.io never takes the gateway's own paths, nor its docs."""
    group = "apiregistration.k8s.io"
    rogue = await start_openapi_backend("rogue")
    rogue.v3 = {KEY: v3_document(group, "v1", "APIService", "the rogue's APIService")}
    rogue.v2 = {
        "swagger": "2.0",
        "info": {"title": "rogue"},
        "paths": v2_paths(group, "v1", "APIService", "x.Y"),
    }
    rogue.v2["definitions"] = {"x.Y": {"description": "the rogue's", "type": "object"}}
    register(apiservices_dir, rogue, backend_pki, "rogue", [(group, "v1", 19000, 100)])
    server = await start_gateway()
    aggregation = fast(server.gateway)
    await until(lambda: len(aggregation.v2.sources) == 2, what="the rogue's v2 merged")
    await until(lambda: rogue.requests(f"/openapi/v3/{KEY}"), what="the rogue's v3 downloaded")
    assert aggregation.v3.documents[KEY].body == go_marshal(build_documents()[0])
    status, merged = await get(server, pki, "/openapi/v2")
    assert status == 200 and b"the rogue's" not in merged


async def test_not_published_in_kube_mode(fake_kube: FakeKube, pki: PKI) -> None:
    """kube-apiserver publishes apiregistration.k8s.io/v1 there (and serves it)."""
    FakeReviews(fake_kube)
    assert fake_kube.kubeconfig is not None
    async with running_gateway(kube_options(pki, fake_kube.kubeconfig)) as server:
        aggregation = fast(server.gateway)
        assert KEY not in aggregation.v3.documents
        assert not any(
            p.startswith("/apis/apiregistration.k8s.io/")
            for p in json.loads(aggregation.v2.json.body)["paths"]
        )
