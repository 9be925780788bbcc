"""TLS settings change under a running gateway: the proxy client certificate files and caBundles."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
from aiohttp import web

from aggregator.tls.issue import issue_client_cert, load_pair, write_pair
from tests.conftest import StartGateway
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    force_available,
    wait_available,
    write_manifests,
)
from tests.support.pki import PKI
from tests.support.polling import until, until_async

THINGS = f"{PREFIX}/namespaces/default/things"


async def test_rotated_proxy_client_certificate_is_presented_without_cutting_watches(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    tmp_path: Path,
) -> None:
    cert, key = tmp_path / "proxy.crt", tmp_path / "proxy.key"
    shutil.copy(pki.path("front-proxy-client.crt"), cert)
    shutil.copy(pki.path("front-proxy-client.key"), key)
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    server = await start_gateway(proxy_client_cert_file=str(cert), proxy_client_key_file=str(key))
    await wait_available(server)
    events = asyncio.Queue[bytes]()

    async def watch(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse()
        await out.prepare(request)
        while True:
            await out.write(await events.get())

    backend.routes[THINGS + "/watched"] = watch
    ctx = pki.client_context()
    async with aiohttp.ClientSession() as session:
        watcher = await session.get(server.url + THINGS + "/watched?watch=true", ssl=ctx)
        events.put_nowait(b"one\n")
        assert await asyncio.wait_for(watcher.content.readline(), 5) == b"one\n"

        rotated = tmp_path / "rotated"
        rotated.mkdir()
        write_pair(
            rotated, "p", issue_client_cert(load_pair(pki.dir, "front-proxy-ca"), "front-proxy-client-2")
        )
        key.write_bytes((rotated / "p.key").read_bytes())
        cert.write_bytes((rotated / "p.crt").read_bytes())

        async def presented() -> str:
            async with session.get(server.url + THINGS, ssl=ctx) as resp:
                assert resp.status == 200
            return backend.seen_by("admin")[-1].peer_cn

        async def rotated_presented() -> bool:
            return await presented() == "front-proxy-client-2"

        await until_async(rotated_presented, 10, "the rotated certificate presented", every=0.2)
        # The watch opened with the old certificate keeps streaming.
        events.put_nowait(b"two\n")
        assert await asyncio.wait_for(watcher.content.readline(), 5) == b"two\n"
        watcher.close()


async def test_a_corrected_ca_bundle_takes_effect(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
) -> None:
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.other_ca.cert_pem),
        *backend_service(backend.port),
    )
    server = await start_gateway()
    ctx = pki.client_context()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + THINGS, ssl=ctx) as resp:
            assert resp.status == 503
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
            *backend_service(backend.port),
        )
        store = server.gateway.store
        await until(
            lambda: getattr(store.apiservice(APISERVICE), "ca_bundle", b"") == backend_pki.ca.cert_pem
        )
        await wait_available(server)
        async with session.get(server.url + THINGS, ssl=ctx) as resp:
            assert resp.status == 200, await resp.text()


async def test_an_unparsable_ca_bundle_is_a_500_with_upstreams_message(
    start_gateway: StartGateway, backend: FakeBackend, pki: PKI, apiservices_dir: Path
) -> None:
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=b"not a certificate"),
        *backend_service(backend.port),
    )
    server = await start_gateway()
    force_available(server)
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + THINGS, ssl=pki.client_context()) as resp,
    ):
        assert resp.status == 500
        doc = await resp.json()
    assert doc["message"] == "unable to load root certificates: unable to parse bytes as PEM block"
    assert backend.seen_by("admin") == []
