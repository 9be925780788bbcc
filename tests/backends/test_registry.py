"""`gateway.backends.fetch`: the gateway's own backend calls (discovery, availability) over real TLS."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from aggregator.backends.errors import BackendError, Hop
from aggregator.contracts import FetchedResponse
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo
from aggregator.sources.store import Store
from tests.conftest import StartGateway
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    write_manifests,
)
from tests.support.fixtures import StartProxied
from tests.support.pki import PKI

ALICE = UserInfo("alice", "uid-1", ("devs", "system:authenticated"), {"scopes": ("read", "write")})


def registered(server_store: Store) -> APIService:
    svc = server_store.apiservice(APISERVICE)
    assert svc is not None
    return svc


async def test_fetch_returns_the_backend_answer_and_asserts_the_user(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    gateway = proxied.server.gateway
    resp = await gateway.backends.fetch(
        registered(gateway.store),
        PREFIX,
        headers={"Accept": "application/json", "X-Remote-User": "admin", "x-remote-group": "system:masters"},
        user=ALICE,
        timeout=5,
    )
    assert isinstance(resp, FetchedResponse)
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("application/json")
    assert b'"user": "alice"' in resp.body
    (seen,) = proxied.backend.seen_by("alice")
    assert seen.peer_cn == "front-proxy-client"
    assert seen.raw_path == PREFIX
    assert seen.one("X-Remote-User") == "alice"
    assert seen.one("X-Remote-Uid") == "uid-1"
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert seen.all("X-Remote-Extra-Scopes") == ["read", "write"]
    assert seen.one("Accept") == "application/json"
    # Nothing invented: no aiohttp User-Agent, no Accept-Encoding the caller did not ask for.
    assert seen.one("User-Agent") is None
    assert seen.one("Accept-Encoding") is None
    assert seen.one("Host") == f"127.0.0.1:{proxied.backend.port}"


async def test_fetch_does_not_follow_redirects(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()

    async def redirect(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": "https://127.0.0.1:1/steal"})

    proxied.backend.routes[PREFIX] = redirect
    gateway = proxied.server.gateway
    resp = await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=5)
    assert resp.status == 302
    assert resp.headers["Location"] == "https://127.0.0.1:1/steal"
    assert len(proxied.backend.seen_by("alice")) == 1


async def test_fetch_wrong_ca_names_the_failure(
    start_proxied: StartProxied, backend: FakeBackend, backend_pki: BackendPKI
) -> None:
    proxied = await start_proxied(
        apiservice=apiservice_manifest(port=backend.port, ca_pem=backend_pki.other_ca.cert_pem), force=True
    )
    gateway = proxied.server.gateway
    with pytest.raises(BackendError) as info:
        await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=5)
    assert info.value.hop is Hop.TLS
    assert (
        info.value.cause == "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    )
    assert str(info.value) == (
        f'Get "https://127.0.0.1:{backend.port}{PREFIX}": tls: failed to verify certificate: '
        "x509: certificate signed by unknown authority"
    )
    assert proxied.backend.received == []


async def test_fetch_wrong_name_lists_the_names_the_certificate_holds(
    start_gateway: StartGateway, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    cert, key = backend_pki.serving("wrong-name", ["other.demo.svc", "api.other.svc"])
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
        gateway = server.gateway
        with pytest.raises(BackendError) as info:
            await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=5)
        assert info.value.hop is Hop.TLS
        assert info.value.cause == (
            "tls: failed to verify certificate: x509: certificate is valid for other.demo.svc, "
            f"api.other.svc, not {SERVER_NAME}"
        )
        assert fake.received == []
    finally:
        await fake.stop()


async def test_fetch_connection_refused(start_proxied: StartProxied, backend: FakeBackend) -> None:
    proxied = await start_proxied()
    await backend.stop()
    gateway = proxied.server.gateway
    with pytest.raises(BackendError) as info:
        await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=5)
    assert info.value.hop is Hop.CONNECT
    assert info.value.cause == f"dial tcp 127.0.0.1:{backend.port}: connect: connection refused"
    text = proxied.server.gateway.metrics.registry.get_sample_value(
        "aggregator_backend_errors_total", {"apiservice": APISERVICE, "kind": "connect"}
    )
    assert text == 1.0


async def test_fetch_timeout(start_proxied: StartProxied) -> None:
    import asyncio

    proxied = await start_proxied()

    release = asyncio.Event()

    async def slow(_request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    proxied.backend.routes[PREFIX] = slow
    gateway = proxied.server.gateway
    with pytest.raises(BackendError) as info:
        await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=0.3)
    release.set()
    assert info.value.hop is Hop.TIMEOUT
    assert info.value.cause == "context deadline exceeded"


async def test_fetch_missing_service_is_a_service_hop_failure(
    start_gateway: StartGateway, backend: FakeBackend, backend_pki: BackendPKI, apiservices_dir: Path
) -> None:
    write_manifests(
        apiservices_dir, "demo", apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem)
    )
    server = await start_gateway()
    gateway = server.gateway
    with pytest.raises(BackendError) as info:
        await gateway.backends.fetch(registered(gateway.store), PREFIX, headers={}, user=ALICE, timeout=5)
    assert info.value.hop is Hop.SERVICE
    assert str(info.value) == 'service "api" not found'
