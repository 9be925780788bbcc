"""Kube mode: kube-apiserver's own OpenAPI (the fake's) merged with a remote backend's."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.kube.calls import GET_OPENAPI_V3_GROUP_VERSION, is_declared
from aggregator.openapi.component import KUBE_APISERVER
from aggregator.openapi.readiness import FirstDownload
from aggregator.runners.server import GatewayServer
from tests.openapi.support import fast, sha512_upper, start_backend, v2_paths, v3_document
from tests.support.backend import BackendPKI, endpointslice_manifest, service_manifest
from tests.support.fakekube import GATEWAY_USER, FakeKube, Seen, apiservice, kube_options
from tests.support.fakeopenapi import KubeOpenAPI
from tests.support.fakereviews import FakeReviews
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

JSON = dict[str, Any]
REMOTE = "remote.example.com"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def body_of(doc: JSON) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def kube_openapi(fake: FakeKube) -> KubeOpenAPI:
    """kube-apiserver's OpenAPI on the fake (kube-openapi's handlers): built-ins and its copy of the remote."""
    kube_copy = v2_paths(REMOTE, "v1", "Widget", "com.example.KubeCopyOnly")
    v2: JSON = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": {
            **v2_paths("", "v1", "Pod", "io.k8s.api.core.v1.Pod"),
            **v2_paths("apps", "v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
            **kube_copy,
        },
        "definitions": {
            "io.k8s.api.core.v1.Pod": {"properties": {"metadata": {"$ref": f"#/definitions/{OBJECT_META}"}}},
            "io.k8s.api.apps.v1.Deployment": {"type": "object"},
            OBJECT_META: {"description": "kube-apiserver's ObjectMeta", "type": "object"},
            "com.example.KubeCopyOnly": {"type": "object"},
        },
        "securityDefinitions": {"BearerToken": {"in": "header", "name": "authorization", "type": "apiKey"}},
        "security": [{"BearerToken": []}],
    }
    documents = {
        "api/v1": v3_document("", "v1", "Pod"),
        "apis/apps/v1": v3_document("apps", "v1", "Deployment"),
        # kube-apiserver's own aggregator publishes the remote group-version too
        f"apis/{REMOTE}/v1": v3_document(REMOTE, "v1", "Widget", "kube-apiserver's copy"),
    }
    return KubeOpenAPI(fake, documents, v2)


def seen(fake: FakeKube, path: str) -> list[Seen]:
    return [r for r in fake.requests if r.path == path]


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
    kube = kube_openapi(fake_kube)
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
        # a ready endpoint: the availability check reaches the backend, and the downloads follow it
        fake_kube.add_object(
            "endpointslices",
            endpointslice_manifest("api-1", [("127.0.0.1", True)], port=backend.port, namespace="remote"),
        )

        assert fake_kube.kubeconfig is not None
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
            assert documents["api/v1"].body == body_of(kube.documents["api/v1"])
            assert documents[f"apis/{REMOTE}/v1"].body == body_of(backend.v3[f"apis/{REMOTE}/v1"])
            # kube-apiserver's copy of the remote group-version is never downloaded
            assert seen(fake_kube, f"/openapi/v3/apis/{REMOTE}/v1") == []
            first = seen(fake_kube, "/openapi/v3/api/v1")
            assert len(first) == 1 and first[0].query == {
                "hash": sha512_upper(body_of(kube.documents["api/v1"]))
            }
            assert {r.user for r in seen(fake_kube, "/openapi/v2")} == {GATEWAY_USER}

            v2 = aggregation.v2
            doc = json.loads(v2.json.body)
            assert doc["info"] == {"title": "Kubernetes", "version": "v1.32.0"}
            assert kube.v2 is not None
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
            count = len(seen(fake_kube, "/openapi/v3"))
            aggregation.refresher.poke(KUBE_APISERVER)
            await until(lambda: len(seen(fake_kube, "/openapi/v3")) > count, what="a second refresh")
            await until(lambda: len(seen(fake_kube, "/openapi/v2")) > 1, what="a second v2 request")
            assert len(seen(fake_kube, "/openapi/v3/api/v1")) == 1
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


# --- a kube-apiserver that is still settling --------------------------------------------------------------


async def kube_gateway(
    fake_kube: FakeKube, pki: PKI
) -> contextlib.AbstractAsyncContextManager[GatewayServer]:
    assert fake_kube.kubeconfig is not None
    return running_gateway(kube_options(pki, fake_kube.kubeconfig))


async def readyz(server: GatewayServer, pki: PKI) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + "/readyz?verbose", ssl=pki.client_context()) as resp,
    ):
        return resp.status, await resp.text()


async def test_a_settling_kube_apiserver_is_read_again_and_published_without_a_failure(
    fake_kube: FakeKube, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: hashes move between the index and the group-version GETs (kube-openapi 301s)."""
    kube = kube_openapi(fake_kube)
    kube.settle(2)  # the documents change right after each of the first two index reads
    with caplog.at_level(logging.INFO, logger="aggregator.openapi"):
        async with await kube_gateway(fake_kube, pki) as server:
            aggregation = server.gateway.control.openapi
            await until(lambda: len(aggregation.v3.documents) == 3, what="kube-apiserver's documents")
            for key in kube.documents:
                assert aggregation.v3.documents[key].body == kube.body(key)  # the settled revision
            await until(lambda: aggregation.kube_ready() is None, what="kube-apiserver's v2 merged")
            _, body = await readyz(server, pki)
            assert "[+]kube-apiserver-openapi ok" in body
    assert 301 in kube.statuses("/openapi/v3/apis/apps/v1")
    # never followed: after a 301 for a document, the index is read before that document is asked again
    sequence = [a for a in kube.answers if a.path.startswith("/openapi/v3")]
    for i, answered in enumerate(sequence):
        if answered.status == 301:
            later = [a.path for a in sequence[i + 1 :] if a.path in (answered.path, "/openapi/v3")]
            assert later[:1] == ["/openapi/v3"], sequence
    failures = [
        r for r in caplog.records if r.name.startswith("aggregator.openapi") and r.levelno >= logging.WARNING
    ]
    assert not failures, caplog.text


async def test_readyz_waits_for_kube_apiservers_openapi_then_passes(fake_kube: FakeKube, pki: PKI) -> None:
    kube = kube_openapi(fake_kube)
    fake_kube.slow(30, verb="GET", resource="/openapi/v3/apis/apps/v1")
    async with await kube_gateway(fake_kube, pki) as server:
        await until(
            lambda: kube.statuses("/openapi/v3") and seen(fake_kube, "/openapi/v3/apis/apps/v1"),
            what="the download under way",
        )
        status, body = await readyz(server, pki)
        assert status == 500 and "[-]kube-apiserver-openapi failed" in body
        fake_kube.release()
        await until(
            lambda: "apis/apps/v1" in server.gateway.control.openapi.v3.documents, what="apps/v1 published"
        )
        await until(lambda: server.gateway.control.openapi.kube_ready() is None, what="v2 merged")
        status, body = await readyz(server, pki)
        assert status == 200 and "[+]kube-apiserver-openapi ok" in body


async def test_a_failed_first_download_is_retried_within_a_second_not_on_the_backoff(
    fake_kube: FakeKube, pki: PKI
) -> None:
    kube = kube_openapi(fake_kube)
    fake_kube.slow(30, verb="GET", resource="/openapi/v3")  # hold the first attempt to set the knobs
    async with await kube_gateway(fake_kube, pki) as server:
        aggregation = server.gateway.control.openapi
        refresher = aggregation.refresher
        refresher.backoff_initial = refresher.backoff_max = (
            60.0  # what the retries would wait without the rule
        )
        await until(lambda: seen(fake_kube, "/openapi/v3"), what="the first index request")
        kube.fail(2)
        fake_kube.release()
        took = await until(lambda: "apis/apps/v1" in aggregation.v3.documents, timeout=10, what="two retries")
        assert kube.statuses("/openapi/v3")[:3] == [503, 503, 200] and took < 10
        # once in, failures go back to the backoff: a refresh that fails now waits the 60 s
        assert aggregation.first_download.retry_delay(aggregation.sources[KUBE_APISERVER], 60.0) is None


async def test_readiness_stops_waiting_after_the_bound(
    fake_kube: FakeKube, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    kube = kube_openapi(fake_kube)
    kube.fail(10_000)  # kube-apiserver refuses its OpenAPI for good
    now = [0.0]
    async with await kube_gateway(fake_kube, pki) as server:
        aggregation = server.gateway.control.openapi
        aggregation.first_download = FirstDownload(bound=30.0, clock=lambda: now[0])
        # downloads start once the objects are listed
        await until(lambda: KUBE_APISERVER in aggregation.sources, what="kube-apiserver's source")
        source = aggregation.sources[KUBE_APISERVER]
        await until(lambda: source.failures >= 1, what="a failed download")
        source.first_attempt = 0.0
        status, body = await readyz(server, pki)
        assert status == 500 and "[-]kube-apiserver-openapi failed" in body
        reason = aggregation.kube_ready() or ""
        assert reason.startswith(
            "kube-apiserver's OpenAPI v3 not downloaded yet (v3: GET /openapi/v3: HTTP 503"
        )
        assert aggregation.first_download.retry_delay(source, 60.0) == 1.0
        now[0] = 30.0
        with caplog.at_level(logging.WARNING, logger="aggregator.openapi.readiness"):
            status, body = await readyz(server, pki)
        assert status == 200 and "[+]kube-apiserver-openapi ok" in body
        assert aggregation.first_download.retry_delay(source, 60.0) is None  # back to the backoff
        assert "readiness no longer waits for it" in caplog.text
