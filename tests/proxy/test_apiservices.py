"""Proxying `/apis/<g>/<v>/...` as a caller meets it: real TLS both ways, a recording backend."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import StartGateway
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    force_available,
    service_manifest,
    status_of,
    use_availability,
    wait_available,
    write_manifests,
)
from tests.support.fixtures import StartProxied
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"


async def test_caller_identity_and_front_proxy_certificate_reach_the_backend(
    start_proxied: StartProxied,
) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", THINGS, headers={"Accept": "application/json"}) as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc == {"path": THINGS, "user": "admin", "groups": ["system:masters", "system:authenticated"]}
    (seen,) = proxied.backend.seen_by("admin")
    assert seen.peer_cn == "front-proxy-client"
    assert seen.method == "GET"
    assert seen.all("X-Remote-Group") == ["system:masters", "system:authenticated"]
    # The client-certificate credential id, key escaped as client-go does and canonicalized as Go sends it.
    (credential,) = seen.all("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id")
    assert credential.startswith("X509SHA256=")
    assert seen.one("X-Forwarded-Proto") == "https"
    assert seen.one("X-Forwarded-Uri") == THINGS
    assert seen.one("X-Forwarded-Host") == f"127.0.0.1:{proxied.backend.port}"
    assert seen.one("X-Forwarded-For") == "127.0.0.1"
    assert seen.one("Host") == f"127.0.0.1:{proxied.backend.port}"


async def test_front_proxy_asserted_user_is_forwarded(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    headers = [("X-Remote-User", "bob"), ("X-Remote-Group", "g1"), ("X-Remote-Extra-Team", "blue")]
    async with proxied.request("GET", THINGS, cert="front-proxy-client", headers=headers) as resp:
        assert resp.status == 200
    (seen,) = proxied.backend.seen_by("bob")
    assert seen.all("X-Remote-User") == ["bob"]
    assert seen.all("X-Remote-Group") == ["g1", "system:authenticated"]
    assert seen.all("X-Remote-Extra-Team") == ["blue"]


def case_variants(name: str) -> list[str]:
    """Every letter case, and the `_` look-alikes a CGI or WSGI backend reads as the same header."""
    mixed = "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(name))
    cases = [name, name.lower(), name.upper(), name.swapcase(), mixed]
    first_dash = name.replace("-", "_", 1)
    return [*cases, name.replace("-", "_"), first_dash, first_dash.swapcase()]


SPOOFED = [
    "X-Remote-User",
    "X-Remote-Uid",
    "X-Remote-Group",
    "X-Remote-Extra-Scopes",
    "X-Remote-Extra-Example.com%2FTeam",
    "Authorization",
    "Proxy-Authorization",
    "X-Auth-User",
    "X-Auth-Groups",
    "X-Auth-Uid",
    "X-Auth-Extra-Scopes",
]


@pytest.mark.parametrize("custom", [False, True], ids=["standard-names", "custom-requestheader-names"])
async def test_spoofed_identity_headers_never_reach_the_backend(
    start_proxied: StartProxied, pki: PKI, custom: bool
) -> None:
    options = {}
    if custom:
        options = {
            "requestheader_username_headers": ["X-Auth-User"],
            "requestheader_uid_headers": ["X-Auth-Uid"],
            "requestheader_group_headers": ["X-Auth-Groups"],
            "requestheader_extra_headers_prefix": ["X-Auth-Extra-"],
        }
    proxied = await start_proxied(**options)
    pki.issue_user("alice", "alice", ("devs",))
    # X-Auth-* only carry identity when configured as requestheader names.
    names = SPOOFED if custom else [n for n in SPOOFED if not n.startswith("X-Auth-")]
    headers = [(variant, "spoofed-system:masters") for name in names for variant in case_variants(name)]
    headers += [(name, "spoofed-again") for name in names]  # and repeated
    async with proxied.request("GET", THINGS, cert="alice", headers=headers) as resp:
        assert resp.status == 200
    (seen,) = proxied.backend.seen_by("alice")
    leaked = [(k, v) for k, v in seen.headers if v.startswith("spoofed")]
    assert leaked == []
    assert seen.all("X-Remote-User") == ["alice"]
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert seen.all("Authorization") == []


async def test_no_credentials_is_401_and_the_backend_sees_nothing(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", PREFIX, cert=None) as resp:
        assert resp.status == 401
        assert status_of(await resp.read())["message"] == "Unauthorized"
    assert proxied.backend.seen_by("system:anonymous") == []
    assert [
        r for r in proxied.backend.received if "system:kube-aggregator" not in r.all("X-Remote-User")
    ] == []


async def test_path_and_query_reach_the_backend_byte_for_byte(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    raw = f"{THINGS}/a%2Fb%2Cc;x=1?labelSelector=a%2Cb&fieldSelector=x%3D%2F&b=1+2&a=%zz&a=2&empty"
    async with proxied.request("GET", raw) as resp:
        assert resp.status == 200
    (seen,) = proxied.backend.seen_by("admin")
    assert seen.raw_path == raw


async def test_gzip_and_content_length_pass_through_untouched(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    payload = json.dumps({"items": list(range(2000))}).encode()
    compressed = gzip.compress(payload)

    async def gzipped(request: web.Request) -> web.StreamResponse:
        assert request.headers.get("Accept-Encoding") == "gzip"
        return web.Response(
            body=compressed,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json", "ETag": '"v1"'},
        )

    proxied.backend.routes[THINGS] = gzipped
    async with proxied.request("GET", THINGS, headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Length"] == str(len(compressed))
        assert "Transfer-Encoding" not in resp.headers
        assert resp.headers["ETag"] == '"v1"'
        assert await resp.read() == compressed


async def test_cors_and_hop_by_hop_response_headers_are_stripped(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()

    async def cors(_request: web.Request) -> web.StreamResponse:
        return web.Response(
            text="{}",
            headers={
                "Access-Control-Allow-Origin": "*",
                "Access-Control-Allow-Credentials": "true",
                "Access-Control-Allow-Methods": "GET",
                "Access-Control-Allow-Headers": "X",
                "Connection": "X-Secret-Hop",
                "X-Secret-Hop": "1",
                "Keep-Alive": "timeout=5",
                "Audit-Id": "abc",
            },
        )

    proxied.backend.routes[THINGS] = cors
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 200
        for name in (
            "Access-Control-Allow-Origin",
            "Access-Control-Allow-Credentials",
            "X-Secret-Hop",
            "Keep-Alive",
        ):
            assert name not in resp.headers
        assert resp.headers["Audit-Id"] == "abc"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_backend_redirect_becomes_502_without_location(start_proxied: StartProxied, code: int) -> None:
    proxied = await start_proxied()

    async def redirect(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers={"Location": "https://169.254.169.254/latest/meta-data"})

    proxied.backend.routes[THINGS] = redirect
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 502
        assert "Location" not in resp.headers
        assert status_of(await resp.read())["message"] == (
            "the backend attempted to redirect this request, which is not permitted"
        )
    assert len(proxied.backend.seen_by("admin")) == 1


async def test_not_modified_without_location_passes(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()

    async def not_modified(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=304, headers={"ETag": '"x"'})

    proxied.backend.routes[THINGS] = not_modified
    async with proxied.request("GET", THINGS, headers={"If-None-Match": '"x"'}) as resp:
        assert resp.status == 304
        assert resp.headers["ETag"] == '"x"'


async def test_watch_events_stream_as_they_happen(start_proxied: StartProxied) -> None:
    """Lockstep: the backend sends event i+1 only once the client has read event i, so a proxy that
    buffered anything (a chunk, a line, the whole body) would stall the exchange, not slow it."""
    proxied = await start_proxied()
    read = [asyncio.Event() for _ in range(5)]

    async def watch(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        for i in range(5):
            await out.write(json.dumps({"type": "ADDED", "object": {"n": i}}).encode() + b"\n")
            await read[i].wait()
        await out.write_eof()
        return out

    proxied.backend.routes[THINGS] = watch
    async with proxied.request("GET", THINGS + "?watch=true") as resp:
        assert resp.status == 200
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        for i in range(5):
            line = await asyncio.wait_for(resp.content.readline(), 10)
            assert json.loads(line)["object"]["n"] == i
            read[i].set()
        assert await asyncio.wait_for(resp.content.read(), 10) == b""
    counted = proxied.server.gateway.metrics.registry.get_sample_value(
        "aggregator_proxy_requests_total", {"apiservice": APISERVICE, "verb": "WATCH", "code": "200"}
    )
    assert counted == 1.0


async def test_client_disconnect_cancels_the_backend_request(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        await out.prepare(request)
        await out.write(b"first\n")
        started.set()
        try:
            await asyncio.sleep(60)  # streams until the test ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return out

    proxied.backend.routes[THINGS] = endless
    session = aiohttp.ClientSession()
    try:
        resp = await session.get(proxied.url + THINGS + "?watch=1", ssl=proxied.pki.client_context())
        assert await resp.content.readline() == b"first\n"
        await started.wait()
        resp.close()  # the client goes away mid-watch
    finally:
        await session.close()
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_large_upload_streams_to_the_backend(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    size = 20 * 1024 * 1024
    counted: list[int] = []

    async def sink(request: web.Request) -> web.StreamResponse:
        total = 0
        async for chunk in request.content.iter_any():
            total += len(chunk)
        counted.append(total)
        return web.json_response({"bytes": total})

    proxied.backend.routes[THINGS] = sink

    async def body() -> AsyncIterator[bytes]:
        block = b"x" * 65536
        for _ in range(size // len(block)):
            yield block

    async with proxied.request("POST", THINGS, data=body()) as resp:
        assert resp.status == 200
        assert await resp.json() == {"bytes": size}
    assert counted == [size]


async def test_unavailable_apiservice_is_503(
    start_proxied: StartProxied, backend: FakeBackend, backend_pki: BackendPKI
) -> None:
    proxied = await start_proxied(
        apiservice=apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem, available=False),
        force=True,
    )

    class NeverAvailable:
        def is_available(self, name: str) -> bool:
            return False

        def reason(self, name: str) -> str:
            return "FailedDiscoveryCheck"

        def add_listener(self, listener: Callable[[str], None]) -> None:
            """Nothing ever changes."""

    use_availability(proxied.server, NeverAvailable())
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 503
        body = status_of(await resp.read())
    assert body["message"] == "service unavailable"
    assert body["reason"] == "ServiceUnavailable"
    assert proxied.backend.seen_by("admin") == []


async def test_unknown_group_version_falls_back_to_404(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", "/apis/other.example.com/v1/things") as resp:
        assert resp.status == 404
        assert status_of(await resp.read())["message"] == "the server could not find the requested resource"


async def test_local_apiservice_falls_back_to_404(start_proxied: StartProxied, apiservices_dir: Path) -> None:
    local = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1.local.example.com"},
        "spec": {
            "group": "local.example.com",
            "version": "v1",
            "groupPriorityMinimum": 100,
            "versionPriority": 1,
        },
    }
    write_manifests(apiservices_dir, "local", local)
    proxied = await start_proxied()
    async with proxied.request("GET", "/apis/local.example.com/v1/things") as resp:
        assert resp.status == 404


@pytest.mark.parametrize(
    ("ca", "hosts", "message"),
    [
        ("other", [SERVER_NAME], "x509: certificate signed by unknown authority"),
        ("right", ["api.other.svc"], f"x509: certificate is valid for api.other.svc, not {SERVER_NAME}"),
    ],
    ids=["wrong-ca", "wrong-name"],
)
async def test_untrusted_backend_certificate_is_503(
    start_gateway: StartGateway,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    ca: str,
    hosts: list[str],
    message: str,
) -> None:
    cert, key = backend_pki.serving(f"cert-{ca}", hosts, ca=backend_pki.other_ca if ca == "other" else None)
    fake = FakeBackend(cert, key, pki.path("front-proxy-ca.crt"))
    port = await fake.start()
    try:
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem),
            *backend_service(port),
        )
        server = await start_gateway()
        force_available(server)
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + THINGS, ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 503
            body = status_of(await resp.read())
        assert (
            body["message"] == f"error trying to reach service: tls: failed to verify certificate: {message}"
        )
        assert fake.received == []
    finally:
        await fake.stop()


async def test_insecure_skip_tls_verify_is_honoured_and_counted(
    start_gateway: StartGateway,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert, key = backend_pki.serving("insecure", ["whatever.example"], ca=backend_pki.other_ca)
    fake = FakeBackend(cert, key, pki.path("front-proxy-ca.crt"))
    port = await fake.start()
    caplog.set_level(logging.WARNING, logger="aggregator.proxy")
    try:
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=port, ca_pem=None, insecure=True),
            *backend_service(port),
        )
        server = await start_gateway()
        await wait_available(server)
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
                    assert resp.status == 200
        gauge = server.gateway.metrics.registry.get_sample_value(
            "aggregator_insecure_backends", {"apiservice": APISERVICE}
        )
        assert gauge == 1.0
        warnings = [r for r in caplog.records if "insecureSkipTLSVerify" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        await fake.stop()


async def test_backend_down_is_503_error_trying_to_reach_service(
    start_proxied: StartProxied, backend: FakeBackend
) -> None:
    proxied = await start_proxied(force=True)
    await backend.stop()
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 503
        message = status_of(await resp.read())["message"]
    assert (
        message
        == f"error trying to reach service: dial tcp 127.0.0.1:{backend.port}: connect: connection refused"
    )


async def test_discovery_requests_time_out(start_proxied: StartProxied) -> None:
    proxied = await start_proxied(force=True)
    proxied.server.gateway.backends.discovery_timeout = 0.3
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response({})

    proxied.backend.routes[PREFIX] = slow
    proxied.backend.routes[THINGS] = slow
    try:
        async with proxied.request("GET", PREFIX) as resp:
            assert resp.status == 503
            assert status_of(await resp.read())["message"] == (
                "error trying to reach service: context deadline exceeded"
            )
        # Only the discovery path is bounded: a resource request waits for its backend.
        task = asyncio.ensure_future(proxied.request("GET", THINGS).__aenter__())
        await asyncio.sleep(0.6)  # a negative check: past the discovery bound, still waiting
        assert not task.done()
        release.set()
        resp = await task
        assert resp.status == 200
        resp.release()
    finally:
        release.set()


async def test_logs_never_carry_bodies_or_credentials(
    start_proxied: StartProxied, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    proxied = await start_proxied()

    async def secret(_request: web.Request) -> web.StreamResponse:
        return web.Response(
            text='{"token":"SENTINEL-BODY-SECRET"}', headers={"Set-Cookie": "session=SENTINEL-COOKIE"}
        )

    async def redirect(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": "https://x/?SENTINEL-LOCATION"})

    proxied.backend.routes[THINGS] = secret
    proxied.backend.routes[THINGS + "/r"] = redirect
    headers = {"Authorization": "Bearer SENTINEL-TOKEN", "X-Remote-Extra-Token": "SENTINEL-EXTRA"}
    async with proxied.request("GET", THINGS, headers=headers) as resp:
        assert b"SENTINEL-BODY-SECRET" in await resp.read()
    async with proxied.request("GET", THINGS + "/r", headers=headers) as resp:
        assert resp.status == 502
    text = caplog.text + " ".join(str(getattr(r, "fields", "")) for r in caplog.records)
    assert "SENTINEL" not in text
    metrics = proxied.server.gateway.metrics
    from prometheus_client import generate_latest

    assert b"SENTINEL" not in generate_latest(metrics.registry)


async def test_backend_cookies_are_not_replayed_to_other_callers(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()

    async def set_cookie(_request: web.Request) -> web.StreamResponse:
        return web.Response(text="{}", headers={"Set-Cookie": "session=alice-secret; Path=/"})

    proxied.backend.routes[THINGS] = set_cookie
    async with proxied.request("GET", THINGS) as resp:
        assert resp.headers["Set-Cookie"].startswith("session=alice-secret")
    pki.issue_user("mallory", "mallory")
    async with proxied.request("GET", PREFIX + "/other", cert="mallory") as resp:
        assert resp.status == 200
    (seen,) = proxied.backend.seen_by("mallory")
    assert seen.all("Cookie") == []


async def test_apiservice_registered_later_is_routed(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
) -> None:
    server = await start_gateway()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 404
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
            *backend_service(backend.port),
        )
        await until(lambda: server.gateway.store.apiservice(APISERVICE) is not None)
        await wait_available(server)
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 200
        (apiservices_dir / "demo.yaml").unlink()
        await until(lambda: server.gateway.store.apiservice(APISERVICE) is None)
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 404


async def test_denied_cluster_ip_is_503_and_never_dialed(
    start_proxied: StartProxied, backend: FakeBackend, caplog: pytest.LogCaptureFixture, apiservices_dir: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.proxy")
    proxied = await start_proxied(force=True)
    write_manifests(
        apiservices_dir, "demo-svc", service_manifest(port=backend.port, cluster_ip="169.254.169.254")
    )
    (apiservices_dir / "demo.yaml").write_text(
        (apiservices_dir / "demo.yaml").read_text().split("---")[0]  # the APIService only
    )
    store = proxied.server.gateway.store
    await until(lambda: getattr(store.service("demo", "api"), "cluster_ip", "") == "169.254.169.254")
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 503
        assert status_of(await resp.read())["message"] == "service unavailable"
    lines = [
        r
        for r in caplog.records
        if r.name == "aggregator.proxy.forward" and getattr(r, "fields", {}).get("hop") == "deny-cidr"
    ]
    assert lines and "169.254.169.254" in fields_of(lines[0])["reason"]
    assert proxied.backend.seen_by("admin") == []


@pytest.mark.parametrize("allowed", [False, True])
async def test_external_name_services_need_the_flag_and_dial_the_pinned_ip(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    allowed: bool,
) -> None:
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        service_manifest(port=backend.port, type_="ExternalName", external_name="api.example.test"),
    )
    server = await start_gateway(allow_external_name_services=allowed)
    force_available(server)
    lookups: list[str] = []

    async def lookup(host: str) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    server.gateway.backends.resolver.lookup = lookup
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + THINGS, ssl=pki.client_context()) as resp,
    ):
        assert resp.status == (200 if allowed else 503)
    # (The gateway's own discovery and availability calls resolve too: every lookup is this name.)
    assert set(lookups) == ({"api.example.test"} if allowed else set())
    assert len(backend.seen_by("admin")) == (1 if allowed else 0)
    if allowed:
        # Verified against the Service name, not the ExternalName, and the Host is the pinned IP.
        assert backend.seen_by("admin")[0].one("Host") == f"127.0.0.1:{backend.port}"


async def test_aggregator_routing_uses_a_ready_endpoint_and_its_target_port(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
) -> None:
    from tests.support.backend import endpointslice_manifest

    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=443, ca_pem=backend_pki.ca.cert_pem),
        # The cluster IP would not answer: only the endpoint does.
        service_manifest(port=443, cluster_ip="127.0.0.3", target_port=backend.port),
        endpointslice_manifest(
            "api-1", [("127.0.0.2", False), ("127.0.0.1", True), ("127.0.0.4", False)], port=backend.port
        ),
    )
    server = await start_gateway(enable_aggregator_routing=True)
    force_available(server)
    async with aiohttp.ClientSession() as session:
        for _ in range(10):
            async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
                assert resp.status == 200
    assert len(backend.seen_by("admin")) == 10


@pytest.mark.parametrize("spelling", [str.title, str.lower, str.upper])
async def test_impersonation_is_applied_not_silently_dropped(
    start_proxied: StartProxied, spelling: Callable[[str], str]
) -> None:
    """S4: `kubectl --as` must not run with the caller's own rights behind its back, and the
    Impersonate-* headers themselves never reach the backend."""
    proxied = await start_proxied()
    headers = {
        spelling("Impersonate-User"): "jane",
        spelling("Impersonate-Group"): "devs",
        spelling("Impersonate-Extra-Scopes"): "view",
        spelling("Impersonate-Uid"): "42",
    }
    async with proxied.request("DELETE", THINGS + "/t1", headers=headers) as resp:
        assert resp.status == 200
    assert proxied.backend.seen_by("admin") == []
    (seen,) = proxied.backend.seen_by("jane")
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert seen.all("X-Remote-Uid") == ["42"]
    assert seen.all("X-Remote-Extra-Scopes") == ["view"]
    assert [k for k, _ in seen.headers if k.lower().startswith("impersonate-")] == []
    # Without a user to impersonate, nothing is forwarded at all (upstream's 500).
    async with proxied.request(
        "DELETE", THINGS + "/t1", headers={spelling("Impersonate-Group"): "x"}
    ) as resp:
        assert resp.status == 500
    callers = [r for r in proxied.backend.received if "system:kube-aggregator" not in r.all("X-Remote-User")]
    assert callers == [seen]


async def test_head_no_content_and_sized_uploads(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    received: list[tuple[str | None, int]] = []

    async def things(request: web.Request) -> web.StreamResponse:
        if request.method == "HEAD":
            return web.Response(headers={"Content-Length": "1234", "Content-Type": "application/json"})
        if request.method == "DELETE":
            return web.Response(status=204)
        body = await request.read()
        received.append((request.headers.get("Content-Length"), len(body)))
        return web.json_response({"bytes": len(body)})

    proxied.backend.routes[THINGS] = things
    async with proxied.request("HEAD", THINGS) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Length"] == "1234"
        assert await resp.read() == b""
    async with proxied.request("DELETE", THINGS) as resp:
        assert resp.status == 204
    payload = b"y" * (5 * 1024 * 1024 + 3)
    async with proxied.request("PUT", THINGS, data=payload) as resp:
        assert await resp.json() == {"bytes": len(payload)}
    assert received == [(str(len(payload)), len(payload))]
    # The same keep-alive connections keep working afterwards.
    for _ in range(5):
        async with proxied.request("GET", THINGS + "/x") as resp:
            assert resp.status == 200


async def test_backend_restart_between_requests_is_invisible(
    start_proxied: StartProxied, backend: FakeBackend
) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 200
    await backend.stop()
    await backend.start()  # same port: the pooled connection is dead, a new one is opened
    for _ in range(3):
        async with proxied.request("GET", THINGS) as resp:
            assert resp.status == 200


async def test_close_delimited_backend_answer_is_streamed_to_its_end(
    start_gateway: StartGateway, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    import ssl as ssl_module

    cert, key = backend_pki.serving("close-delimited", [SERVER_NAME])
    ctx = ssl_module.create_default_context(ssl_module.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        for i in range(3):
            writer.write(f"part {i}\n".encode())
            await writer.drain()
        writer.close()

    raw = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    port = raw.sockets[0].getsockname()[1]
    try:
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem),
            *backend_service(port),
        )
        server = await start_gateway()
        force_available(server)
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + THINGS, ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 200
            assert await resp.read() == b"part 0\npart 1\npart 2\n"
    finally:
        raw.close()


async def test_backend_connections_are_kept_alive_and_reused(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    for _ in range(20):
        async with proxied.request("GET", THINGS) as resp:
            assert resp.status == 200
    seen = proxied.backend.seen_by("admin")
    assert len(seen) == 20
    # One connection, or a second one opened while the gateway's own discovery, OpenAPI or
    # availability request held the first: they share the pool of this TLS setting.
    assert len({r.connection for r in seen}) <= 3

    # Concurrent requests open more connections, then share them.
    async def one() -> int:
        async with proxied.request("GET", THINGS) as resp:
            return resp.status

    assert await asyncio.gather(*(one() for _ in range(8))) == [200] * 8
    assert len({r.connection for r in proxied.backend.seen_by("admin")}) <= 9
