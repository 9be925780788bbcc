"""OpenAPI through a local-mode gateway: real TLS backends, the gateway's own refreshes, what clients see."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.openapi.local import build_documents
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import new_ca
from aggregator.wire.jsonenc import go_marshal
from tests.conftest import StartGateway
from tests.openapi.conftest import StartBackend
from tests.openapi.support import (
    OpenAPIBackend,
    aggregation_of,
    fast,
    register,
    sha512_upper,
    v2_paths,
    v3_document,
)
from tests.support.backend import BackendPKI, apiservice_manifest, write_manifests
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until

PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
# Local mode publishes its own apiregistration.k8s.io/v1 beside the backends' documents.
OWN = "apis/apiregistration.k8s.io/v1"
PROTOBUF_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


class Client:
    def __init__(self, server: GatewayServer, pki: PKI) -> None:
        self.server = server
        self.ssl = pki.client_context("admin")

    async def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        async with (
            aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",)) as session,
            session.get(self.server.url + path, headers=headers, ssl=self.ssl, allow_redirects=False) as resp,
        ):
            return resp.status, dict(resp.headers), await resp.read()

    async def json(self, path: str) -> Any:
        status, _, body = await self.get(path, Accept="application/json")
        assert status == 200, body
        return json.loads(body)


def wardle_like(backend: OpenAPIBackend, group: str) -> None:
    """A backend for `group` v1 that also publishes documents for other groups (which must be ignored)."""
    backend.v3 = {
        f"apis/{group}/v1": v3_document(group, "v1", "Widget"),
        "apis/apps/v1": v3_document("apps", "v1", "Deployment", "a hijack attempt"),
    }
    backend.extra_index = {"api/v1": "/apis/not-openapi?hash=X"}
    backend.v2 = {
        "swagger": "2.0",
        "info": {"title": group, "version": "v1"},
        "paths": {
            **v2_paths(group, "v1", "Widget", "com.example.Widget"),
            **v2_paths("apps", "v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
        },
        "definitions": {
            "com.example.Widget": {
                "description": f"a widget of {group}",
                "type": "object",
                "properties": {"notes": {"description": "long text " * 200, "type": "string"}},
            },
            "io.k8s.api.apps.v1.Deployment": {"description": "hijacked", "type": "object"},
        },
    }


async def test_v3_index_and_documents_as_kube_openapi_serves_them(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    alpha = await start_openapi_backend("alpha")
    wardle_like(alpha, "alpha.example.com")
    register(apiservices_dir, alpha, backend_pki, "alpha", [("alpha.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    client = Client(server, pki)
    aggregation = fast(server.gateway)
    await until(lambda: "apis/alpha.example.com/v1" in aggregation.v3.documents, what="the alpha document")

    status, headers, body = await client.get("/openapi/v3")
    assert status == 200 and headers["Content-Type"] == "application/json"
    index = json.loads(body)
    expected_doc = json.dumps(alpha.v3["apis/alpha.example.com/v1"], separators=(",", ":")).encode()
    digest = sha512_upper(expected_doc)
    own = sha512_upper(go_marshal(build_documents()[0]))
    # only the APIService's own group-version: not apps/v1, not api/v1 (and the gateway's own)
    assert index == {
        "paths": {
            "apis/alpha.example.com/v1": {
                "serverRelativeURL": f"/openapi/v3/apis/alpha.example.com/v1?hash={digest}"
            },
            OWN: {"serverRelativeURL": f"/openapi/v3/{OWN}?hash={own}"},
        }
    }
    assert headers["Etag"] == f'"{sha512_upper(body)}"'

    url = index["paths"]["apis/alpha.example.com/v1"]["serverRelativeURL"]
    status, headers, body = await client.get(url)
    assert status == 200 and body == expected_doc  # the backend's bytes, unchanged
    assert headers["Etag"] == f'"{digest}"' and headers["Vary"] == "Accept"
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "public, immutable"
    expires = time.mktime(time.strptime(headers["Expires"], "%a, %d %b %Y %H:%M:%S GMT"))
    assert 364 * 86400 < expires - time.mktime(time.gmtime()) < 367 * 86400

    status, headers, body = await client.get("/openapi/v3/apis/alpha.example.com/v1?hash=STALE")
    assert status == 301 and headers["Location"] == url and body == b""

    status, headers, _ = await client.get("/openapi/v3/apis/alpha.example.com/v1")
    assert status == 200 and "Cache-Control" not in headers and "Expires" not in headers
    status, headers, body = await client.get(url, **{"If-None-Match": f'"{digest}"'})
    assert (status, body) == (304, b"") and headers["Etag"] == f'"{digest}"'
    status, _, _ = await client.get(url, **{"If-None-Match": f'"OTHER", W/"{digest}"'})
    assert status == 304

    status, headers, body = await client.get(
        url, Accept="application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
    )
    assert (status, body) == (406, b"") and headers["Vary"] == "Accept"
    status, _, _ = await client.get(
        url, Accept="application/com.github.proto-openapi.spec.v3@v1.0+protobuf, */*;q=0.5"
    )
    assert status == 200
    assert (await client.get("/openapi/v3/apis/apps/v1"))[0] == 404
    assert (await client.get("/openapi/v3/api/v1"))[0] == 404
    assert alpha.requests("/apis/not-openapi") == []  # the index cannot send the gateway elsewhere


async def test_v2_merges_backends_by_priority_renaming_conflicts(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    low = await start_openapi_backend("low")
    high = await start_openapi_backend("high")
    wardle_like(low, "low.example.com")
    wardle_like(high, "high.example.com")
    register(apiservices_dir, low, backend_pki, "low", [("low.example.com", "v1", 100, 15)])
    register(apiservices_dir, high, backend_pki, "high", [("high.example.com", "v1", 2000, 15)])
    server = await start_gateway()
    client = Client(server, pki)
    aggregation = fast(server.gateway)
    await until(lambda: len(aggregation.v2.sources) == 3, what="both backends merged")
    assert aggregation.v2.sources == ("gateway", "v1.high.example.com", "v1.low.example.com")

    doc = await client.json("/openapi/v2")
    assert doc["swagger"] == "2.0" and doc["info"]["title"] == "Kubernetes"
    own_v2 = build_documents()[1]
    assert sorted(doc["paths"]) == sorted(
        [
            *own_v2["paths"],  # the gateway's own apiregistration.k8s.io/v1 first
            "/apis/high.example.com/v1/",
            "/apis/high.example.com/v1/widgets",
            "/apis/low.example.com/v1/",
            "/apis/low.example.com/v1/widgets",
        ]
    )  # each backend's paths under its own group-version only
    assert set(doc["definitions"]) == {
        *own_v2["definitions"],
        "com.example.Widget",
        "com.example.Widget_v2",
    }  # apps/v1 never merged
    assert doc["definitions"]["com.example.Widget"]["description"] == "a widget of high.example.com"
    assert doc["definitions"]["com.example.Widget_v2"]["description"] == "a widget of low.example.com"
    low_list = doc["paths"]["/apis/low.example.com/v1/widgets"]["get"]
    assert low_list["responses"]["200"]["schema"] == {"$ref": "#/definitions/com.example.Widget_v2"}

    status, headers, body = await client.get(
        "/openapi/v2", Accept="application/json", **{"Accept-Encoding": "gzip"}
    )
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    plain = gzip.decompress(body)
    assert json.loads(plain) == doc
    etag = headers["Etag"]
    assert etag == f'"{hashlib.sha512(plain).hexdigest().upper()}"'
    assert headers["Vary"] == "Accept, Accept-Encoding"
    assert (await client.get("/openapi/v2", **{"If-None-Match": etag}))[0] == 304

    status, headers, body = await client.get("/openapi/v2", Accept=PROTOBUF)
    assert status == 200 and headers["Content-Type"] == PROTOBUF_TYPE
    assert headers["Etag"] == etag and body.startswith(b"\n\x032.0")  # Document.swagger = "2.0"
    assert (await client.get("/openapi/v2", Accept=PROTOBUF_TYPE))[1]["Content-Type"] == PROTOBUF_TYPE
    status, _, body = await client.get("/openapi/v2", Accept="text/html")
    assert (status, body) == (406, b"")
    assert (await client.get("/openapi/v2", Accept=f"text/html, {PROTOBUF};q=0.5"))[1][
        "Content-Type"
    ] == PROTOBUF_TYPE


async def test_404_is_retried_with_backoff_until_the_backend_publishes(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_openapi_backend("late")
    wardle_like(backend, "late.example.com")
    backend.status = {"v2": 404, "v3": 404}
    register(apiservices_dir, backend, backend_pki, "late", [("late.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    aggregation = fast(server.gateway, backoff=0.05, backoff_max=0.4)
    started = time.monotonic()
    await until(lambda: len(backend.requests("/openapi/v2")) >= 4, what="retries")
    seen = [r for r in backend.backend.received if r.raw_path == "/openapi/v2"]
    assert set(aggregation.v3.documents) == {OWN} and aggregation.v2.sources == ("gateway",)
    # backoff, not a busy loop: the 4th attempt comes after 0.1 + 0.2 s of waiting at least (the
    # first wait may precede `fast`), each jittered down by at most 10%
    assert time.monotonic() - started >= 0.27 and len(seen) < 10
    metrics = server.gateway.metrics.registry
    # Counted once the answer is read: the backend has seen the 4th request a moment before.
    await until(
        lambda: (
            metrics.get_sample_value(
                "aggregator_openapi_fetches_total",
                {"apiservice": "v1.late.example.com", "document": "v2", "result": "not_found"},
            )
            or 0
        )
        >= 4,
        what="four 404s counted",
    )

    backend.status = {}  # the backend starts publishing; no APIService changes
    await until(lambda: "v1.late.example.com" in aggregation.v2.sources, what="the late v2 document")
    await until(lambda: "apis/late.example.com/v1" in aggregation.v3.documents, what="the late v3 document")
    assert "/apis/late.example.com/v1/widgets" in (await Client(server, pki).json("/openapi/v2"))["paths"]


async def test_refreshes_revalidate_share_one_download_per_service_and_keep_documents_when_down(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_openapi_backend("multi")
    wardle_like(backend, "multi.example.com")
    backend.v3["apis/multi.example.com/v2"] = v3_document("multi.example.com", "v2", "Widget")
    backend.v2["paths"].update(v2_paths("multi.example.com", "v2", "Widget", "com.example.Widget"))
    register(
        apiservices_dir,
        backend,
        backend_pki,
        "multi",
        [("multi.example.com", "v1", 1000, 15), ("multi.example.com", "v2", 1000, 20)],
    )
    server = await start_gateway()
    aggregation = fast(server.gateway, interval=0.1)
    await until(lambda: len(backend.requests("/openapi/v2")) >= 3, what="three refreshes")
    # The merge runs in a thread after the download that fed it: wait for it, not for a guess.
    merged = ("gateway", "v2.multi.example.com", "v1.multi.example.com")
    await until(lambda: aggregation.v2.sources == merged, what="the merged v2 document")
    v2_requests = backend.requests("/openapi/v2")
    # two APIServices, one Service: one download per refresh, revalidated with the server's ETag
    assert len(backend.requests("/openapi/v3")) in (len(v2_requests), len(v2_requests) + 1)
    assert v2_requests[0].one("If-None-Match") is None
    assert all(r.one("If-None-Match") for r in v2_requests[1:])
    assert all(r.one("X-Remote-User") == "system:kube-aggregator" for r in v2_requests)
    # per-GV documents are downloaded once: the index hash did not change
    assert len(backend.requests("/openapi/v3/apis/multi.example.com/v1")) == 1
    merges = server.gateway.metrics.registry.get_sample_value("aggregator_openapi_v2_merges_total")
    assert merges is not None and merges <= 3  # nothing changed, nothing re-merged

    v3_before, v2_before = aggregation.v3, aggregation.v2
    backend.status = {"v2": 500, "v3": 503}
    count = len(backend.requests("/openapi/v2"))
    await until(lambda: len(backend.requests("/openapi/v2")) >= count + 2, what="failed refreshes")
    assert aggregation.v3 is v3_before and aggregation.v2 is v2_before  # last good documents stay

    backend.v3["apis/multi.example.com/v1"] = v3_document("multi.example.com", "v1", "Widget", "changed")
    backend.status = {}
    await until(
        lambda: b"changed" in aggregation.v3.documents["apis/multi.example.com/v1"].body,
        what="the changed document",
    )
    assert len(backend.requests("/openapi/v3/apis/multi.example.com/v1")) == 2


async def test_apiservice_changes_take_effect_without_waiting_for_the_refresh_interval(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    first = await start_openapi_backend("first")
    wardle_like(first, "first.example.com")
    register(apiservices_dir, first, backend_pki, "first", [("first.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    aggregation = fast(server.gateway)  # 60 s interval: only events can explain a quick update
    await until(lambda: "apis/first.example.com/v1" in aggregation.v3.documents, what="first")

    second = await start_openapi_backend("second")
    wardle_like(second, "second.example.com")
    register(apiservices_dir, second, backend_pki, "second", [("second.example.com", "v1", 1000, 15)])
    await until(lambda: "apis/second.example.com/v1" in aggregation.v3.documents, what="second")
    await until(lambda: "v1.second.example.com" in aggregation.v2.sources, what="second in v2")

    (apiservices_dir / "first-api.yaml").unlink()
    await until(lambda: "apis/first.example.com/v1" not in aggregation.v3.documents, what="first removed")
    await until(lambda: "v1.first.example.com" not in aggregation.v2.sources, what="first out of v2")
    index = await Client(server, pki).json("/openapi/v3")
    assert list(index["paths"]) == [OWN, "apis/second.example.com/v1"]


async def test_a_backend_without_v3_is_served_converted_from_v2_at_the_normal_interval(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_openapi_backend("legacy")
    wardle_like(backend, "legacy.example.com")
    backend.status = {"v3": 404}
    register(apiservices_dir, backend, backend_pki, "legacy", [("legacy.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    aggregation = fast(server.gateway)
    key = "apis/legacy.example.com/v1"
    await until(lambda: key in aggregation.v3.documents, what="the converted document")
    doc = json.loads(aggregation.v3.documents[key].body)
    assert doc["openapi"] == "3.0.0"
    assert sorted(doc["paths"]) == ["/apis/legacy.example.com/v1/", "/apis/legacy.example.com/v1/widgets"]
    assert set(doc["components"]["schemas"]) == {"com.example.Widget"}  # apps/v1's are not this group's
    widgets = doc["paths"]["/apis/legacy.example.com/v1/widgets"]["get"]["responses"]["200"]
    assert widgets == {"description": "OK"}  # no `produces` anywhere: upstream drops the schema too
    source_key = next(iter(aggregation.members))
    assert aggregation.refresher.failures(source_key) == 0  # a healthy legacy server, not a failing one

    backend.status = {"v3": 404, "v2": 404}  # no OpenAPI at all any more
    aggregation.refresher.poke(source_key)
    await until(lambda: key not in aggregation.v3.documents, what="the document dropped")


async def test_backends_follow_the_same_hash_redirect_rule(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    pki: PKI,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
) -> None:
    """A settling backend's 301 to its current hash re-reads its index; a 301 anywhere else is refused."""
    settling = await start_openapi_backend("settling")
    settling.v3 = {"apis/settling.example.com/v1": v3_document("settling.example.com", "v1", "Widget")}
    settling.v2 = {"swagger": "2.0", "paths": v2_paths("settling.example.com", "v1", "Widget", "W")}
    settling.settle(2)
    hostile = await start_openapi_backend("hostile")
    hostile.v3 = {"apis/hostile.example.com/v1": v3_document("hostile.example.com", "v1", "Widget")}
    hostile.v2 = {"swagger": "2.0", "paths": v2_paths("hostile.example.com", "v1", "Widget", "W")}
    hostile.redirects = {"apis/hostile.example.com/v1": "/openapi/v3/apis/apps/v1?hash=X"}
    register(apiservices_dir, settling, backend_pki, "settling", [("settling.example.com", "v1", 1000, 15)])
    register(apiservices_dir, hostile, backend_pki, "hostile", [("hostile.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    aggregation = fast(server.gateway)
    key = "apis/settling.example.com/v1"
    await until(lambda: key in aggregation.v3.documents, what="the settling backend's document")
    assert json.loads(aggregation.v3.documents[key].body) == settling.v3[key]  # its settled revision
    statuses = [
        r.raw_path.split("?")[0] for r in settling.backend.received if r.raw_path.startswith("/openapi/v3")
    ]
    # read, 301, read again, 301, read again, 200: one refresh, no failure
    assert statuses[:6] == ["/openapi/v3", f"/openapi/v3/{key}"] * 3 and settling.settling == 0

    source = next(s for s in aggregation.sources.values() if s.name.startswith("hostile/"))
    await until(lambda: "refused" in source.last_error, what="the hostile redirect refused")
    assert "redirect to '/openapi/v3/apis/apps/v1?hash=X' refused (never followed)" in source.last_error
    assert hostile.requests("/openapi/v3/apis/apps/v1") == []
    assert "apis/hostile.example.com/v1" not in aggregation.v3.documents
    settling_source = next(s for s in aggregation.sources.values() if s.name.startswith("settling/"))
    metrics = server.gateway.metrics.registry

    def fetches(result: str) -> float:
        labels = {"apiservice": settling_source.labels()[0], "document": "v3", "result": result}
        return metrics.get_sample_value("aggregator_openapi_fetches_total", labels) or 0.0

    assert fetches("moved") == 2 and fetches("error") == 0  # two re-reads, never a failed download


async def test_a_bad_ca_beside_a_good_one_on_the_same_service_is_labelled_with_its_own_apiservice(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two APIServices of one Service, one with a caBundle that did not sign the backend: the failure
    is logged (at debug level: a backend it cannot reach, a failed handshake included, is the
    availability checker's to report) and counted under the failing APIService, and, since it never
    had documents, never said to serve "the last good" ones."""
    caplog.set_level(logging.DEBUG, logger="aggregator.openapi.sources")
    backend = await start_openapi_backend("shared")
    wardle_like(backend, "good.example.com")
    backend.v3["apis/bad.example.com/v1"] = v3_document("bad.example.com", "v1", "Widget")
    register(apiservices_dir, backend, backend_pki, "shared", [("good.example.com", "v1", 1000, 15)])
    bad = apiservice_manifest(
        port=backend.port, ca_pem=new_ca("not-the-backends-ca").cert_pem, group="bad.example.com",
        version="v1", namespace="shared", service="api",
    )  # fmt: skip
    write_manifests(apiservices_dir, "bad", bad)
    server = await start_gateway()
    # Without the checker's word: it would keep the download from dialing a backend whose handshake
    # the check saw fail. The download's own failure is what this test looks at.
    aggregation_of(server.gateway).reachability = None
    aggregation = fast(server.gateway)
    await until(lambda: "apis/good.example.com/v1" in aggregation.v3.documents, what="the good document")
    failed = "OpenAPI v3 download failed; no documents to serve until one succeeds"
    await until(lambda: any(r.getMessage() == failed for r in caplog.records), what="the bad CA's failure")
    record = next(r for r in caplog.records if r.getMessage() == failed)
    assert record.levelno == logging.DEBUG
    assert fields_of(record)["apiservices"] == "v1.bad.example.com"
    assert fields_of(record)["service"] == f"shared/api:{backend.port}"
    assert "x509" in fields_of(record)["error"] or "certificate" in fields_of(record)["error"]
    openapi_lines = [r for r in caplog.records if r.name == "aggregator.openapi.sources"]
    assert not any("last good" in r.getMessage() for r in openapi_lines)
    assert not any(
        fields_of(r).get("apiservices") == "v1.good.example.com"
        for r in openapi_lines
        if "failed" in r.getMessage()
    )
    metrics = server.gateway.metrics.registry

    def fetches(apiservice: str, result: str) -> float:
        labels = {"apiservice": apiservice, "document": "v3", "result": result}
        return metrics.get_sample_value("aggregator_openapi_fetches_total", labels) or 0.0

    assert fetches("v1.bad.example.com", "error") >= 1 and fetches("v1.bad.example.com", "ok") == 0
    assert fetches("v1.good.example.com", "ok") >= 1 and fetches("v1.good.example.com", "error") == 0
    assert "apis/bad.example.com/v1" not in aggregation.v3.documents


async def test_a_failure_after_a_success_says_the_last_good_documents_are_served(
    start_openapi_backend: StartBackend,
    start_gateway: StartGateway,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.openapi.sources")
    backend = await start_openapi_backend("flaky")
    wardle_like(backend, "flaky.example.com")
    register(apiservices_dir, backend, backend_pki, "flaky", [("flaky.example.com", "v1", 1000, 15)])
    server = await start_gateway()
    aggregation = fast(server.gateway, interval=0.1)
    await until(lambda: "apis/flaky.example.com/v1" in aggregation.v3.documents, what="the first download")
    backend.status = {"v3": 500}
    failed = "OpenAPI v3 download failed; serving the last good documents"
    await until(lambda: any(r.getMessage() == failed for r in caplog.records), what="the failure")
    (record,) = [r for r in caplog.records if r.getMessage() == failed]
    assert fields_of(record)["apiservices"] == "v1.flaky.example.com"
    assert "apis/flaky.example.com/v1" in aggregation.v3.documents
