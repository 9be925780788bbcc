"""Kube mode: kube-apiserver's own OpenAPI (the fake's) merged with a remote backend's."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from aggregator.kube.calls import GET_OPENAPI_V3_GROUP_VERSION, is_declared
from aggregator.openapi.component import KUBE_APISERVER
from tests.openapi.support import fast, sha512_upper, start_backend, v2_paths, v3_document
from tests.support.backend import BackendPKI, service_manifest
from tests.support.fakekube import GATEWAY_USER, FakeKube, apiservice, kube_options
from tests.support.fakereviews import FakeReviews
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

JSON = dict[str, Any]
REMOTE = "remote.example.com"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def body_of(doc: JSON) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class KubeOpenAPI:
    """kube-apiserver's OpenAPI on the fake: an index with hashes, per-GV documents, v2 with ETag."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.v3: dict[str, JSON] = {
            "api/v1": v3_document("", "v1", "Pod"),
            "apis/apps/v1": v3_document("apps", "v1", "Deployment"),
            # kube-apiserver's own aggregator publishes the remote group-version too
            f"apis/{REMOTE}/v1": v3_document(REMOTE, "v1", "Widget", "kube-apiserver's copy"),
        }
        kube_copy = v2_paths(REMOTE, "v1", "Widget", "com.example.KubeCopyOnly")
        self.v2: JSON = {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": {
                **v2_paths("", "v1", "Pod", "io.k8s.api.core.v1.Pod"),
                **v2_paths("apps", "v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
                **kube_copy,
            },
            "definitions": {
                "io.k8s.api.core.v1.Pod": {
                    "properties": {"metadata": {"$ref": f"#/definitions/{OBJECT_META}"}}
                },
                "io.k8s.api.apps.v1.Deployment": {"type": "object"},
                OBJECT_META: {"description": "kube-apiserver's ObjectMeta", "type": "object"},
                "com.example.KubeCopyOnly": {"type": "object"},
            },
            "securityDefinitions": {
                "BearerToken": {"in": "header", "name": "authorization", "type": "apiKey"}
            },
            "security": [{"BearerToken": []}],
        }
        fake.add_route("GET", "/openapi/v3", self._index)
        fake.add_route("GET", "/openapi/v2", self._v2)
        for key in self.v3:
            fake.add_route("GET", f"/openapi/v3/{key}", self._document)

    async def _index(self, _request: web.Request) -> web.Response:
        paths = {
            k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={sha512_upper(body_of(d))}"}
            for k, d in self.v3.items()
        }
        return web.json_response({"paths": paths})

    async def _document(self, request: web.Request) -> web.Response:
        return web.Response(
            body=body_of(self.v3[request.path.removeprefix("/openapi/v3/")]), content_type="application/json"
        )

    async def _v2(self, request: web.Request) -> web.Response:
        body = body_of(self.v2)
        etag = f'"{sha512_upper(body)}"'
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"Etag": etag})
        return web.Response(body=body, headers={"Etag": etag, "Content-Type": "application/json"})

    def seen(self, path: str) -> list[Any]:
        return [r for r in self.fake.requests if r.path == path]


def test_group_version_documents_are_one_declared_call() -> None:
    assert is_declared(GET_OPENAPI_V3_GROUP_VERSION)
    assert GET_OPENAPI_V3_GROUP_VERSION.url_path(name="apis/apps/v1") == "/openapi/v3/apis/apps/v1"
    with pytest.raises(ValueError, match="rest of the path"):
        GET_OPENAPI_V3_GROUP_VERSION.url_path()


async def test_kube_apiserver_documents_first_remote_group_versions_from_their_backend(
    fake_kube: FakeKube,
    pki: PKI,
    backend_pki: BackendPKI,
    tmp_path: Path,
) -> None:
    FakeReviews(fake_kube)
    kube = KubeOpenAPI(fake_kube)
    backend = await start_backend(backend_pki, pki, "remote")
    try:
        backend.v3 = {f"apis/{REMOTE}/v1": v3_document(REMOTE, "v1", "Widget", "the backend's own")}
        backend.v2 = {
            "swagger": "2.0",
            "info": {"title": "remote"},
            "paths": v2_paths(REMOTE, "v1", "Widget", OBJECT_META),
            "definitions": {OBJECT_META: {"description": "the backend's older ObjectMeta", "type": "object"}},
        }
        remote = apiservice(REMOTE, "v1", service=("remote", "api"))
        remote["spec"].pop("insecureSkipTLSVerify")
        remote["spec"]["service"]["port"] = backend.port
        remote["spec"]["caBundle"] = base64.b64encode(backend_pki.ca.cert_pem).decode()
        fake_kube.add_object("apiservices", remote)
        fake_kube.add_object("apiservices", apiservice("apps", "v1", service=None))
        fake_kube.add_object("services", service_manifest(port=backend.port, namespace="remote"))

        async with running_gateway(kube_options(pki, fake_kube.kubeconfig)) as server:
            aggregation = fast(server.gateway, backoff=0.05)
            await until(
                lambda: (
                    aggregation.v2.sources == (KUBE_APISERVER, f"v1.{REMOTE}")
                    and len(aggregation.v3.documents) == 3
                ),
                what="kube-apiserver's and the backend's documents",
            )
            documents = aggregation.v3.documents
            assert sorted(documents) == ["api/v1", "apis/apps/v1", f"apis/{REMOTE}/v1"]
            assert documents["api/v1"].body == body_of(kube.v3["api/v1"])
            assert documents[f"apis/{REMOTE}/v1"].body == body_of(backend.v3[f"apis/{REMOTE}/v1"])
            # kube-apiserver's copy of the remote group-version is never downloaded
            assert kube.seen(f"/openapi/v3/apis/{REMOTE}/v1") == []
            first = kube.seen("/openapi/v3/api/v1")
            assert len(first) == 1 and first[0].query == {"hash": sha512_upper(body_of(kube.v3["api/v1"]))}
            assert {r.user for r in kube.seen("/openapi/v2")} == {GATEWAY_USER}

            v2 = aggregation.v2
            doc = json.loads(v2.json.body)
            assert doc["info"] == {"title": "Kubernetes", "version": "v1.32.0"}
            assert doc["securityDefinitions"] == kube.v2["securityDefinitions"]
            assert sorted(doc["paths"]) == [
                "/api/v1/",
                "/api/v1/pods",
                "/apis/apps/v1/",
                "/apis/apps/v1/deployments",
                f"/apis/{REMOTE}/v1/",
                f"/apis/{REMOTE}/v1/widgets",
            ]
            widgets = doc["paths"][f"/apis/{REMOTE}/v1/widgets"]["get"]["responses"]["200"]["schema"]
            assert widgets == {"$ref": f"#/definitions/{OBJECT_META}_v2"}  # the backend's, renamed
            assert doc["definitions"][OBJECT_META]["description"] == "kube-apiserver's ObjectMeta"
            assert doc["definitions"][f"{OBJECT_META}_v2"]["description"] == "the backend's older ObjectMeta"
            assert "com.example.KubeCopyOnly" not in doc["definitions"]  # only kube's copy used it

            # another refresh: nothing downloaded again, nothing re-merged
            count = len(kube.seen("/openapi/v3"))
            aggregation.refresher.poke(KUBE_APISERVER)
            await until(lambda: len(kube.seen("/openapi/v3")) > count, what="a second refresh")
            await until(lambda: len(kube.seen("/openapi/v2")) > 1, what="a second v2 request")
            assert len(kube.seen("/openapi/v3/api/v1")) == 1
            assert aggregation.v2 is v2
            conditional = [r for r in fake_kube.requests if r.path == "/openapi/v2"]
            assert len(conditional) >= 2

            # the APIService goes away: its group-version is kube-apiserver's again
            fake_kube.delete_object("apiservices", f"v1.{REMOTE}")
            await until(
                lambda: (
                    b"kube-apiserver's copy" in aggregation.v3.documents[f"apis/{REMOTE}/v1"].body
                    if f"apis/{REMOTE}/v1" in aggregation.v3.documents
                    else False
                ),
                what="kube-apiserver's copy of the remote group-version",
            )
            await until(lambda: aggregation.v2.sources == (KUBE_APISERVER,), what="v2 without the backend")
            doc = json.loads(aggregation.v2.json.body)
            widgets = doc["paths"][f"/apis/{REMOTE}/v1/widgets"]["get"]["responses"]["200"]["schema"]
            assert widgets == {"$ref": "#/definitions/com.example.KubeCopyOnly"}
    finally:
        await backend.backend.stop()
