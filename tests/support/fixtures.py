"""Shared fixtures, loaded by tests/conftest.py: a fake extension server, and a local-mode gateway
registered to proxy to it (`start_proxied`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop

from aggregator.runners.server import GatewayServer
from tests.conftest import StartGateway
from tests.support.backend import (
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    force_available,
    make_backend_pki,
    wait_available,
    write_manifests,
)
from tests.support.pki import PKI


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Tests marked `uvloop` run on the gateway's production loop (its TLS transport reports some
    failures differently from asyncio's); the others on asyncio's own loop, as everywhere else."""
    if item.get_closest_marker("uvloop") is not None:
        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture(scope="session")
def backend_pki(tmp_path_factory: pytest.TempPathFactory) -> BackendPKI:
    return make_backend_pki(tmp_path_factory.mktemp("backend-pki"))


@pytest.fixture
async def backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[FakeBackend]:
    cert, key = backend_pki.serving("api", [SERVER_NAME])
    fake = FakeBackend(cert, key, pki.path("front-proxy-ca.crt"))
    await fake.start()
    yield fake
    await fake.stop()


@dataclass
class Proxied:
    server: GatewayServer
    backend: FakeBackend
    pki: PKI
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url

    def request(
        self, method: str, path: str, *, cert: str | None = "admin", **kwargs: Any
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """`async with proxied.request("GET", "/apis/...") as resp` as the `cert` user."""
        from yarl import URL

        return self.session.request(
            method, URL(self.url + path, encoded=True), ssl=self.pki.client_context(cert), **kwargs
        )


StartProxied = Callable[..., Awaitable[Proxied]]


@pytest.fixture
async def start_proxied(
    start_gateway: StartGateway,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
) -> AsyncIterator[StartProxied]:
    """`await start_proxied(**gateway_options)`: the demo APIService registered, gateway running."""
    sessions: list[aiohttp.ClientSession] = []

    async def start(
        *,
        manifests: bool = True,
        apiservice: dict[str, Any] | None = None,
        force: bool = False,
        **options: Any,
    ) -> Proxied:
        """`force`: the proxy is told the APIService is available whatever the checker finds
        (for tests of the proxy's own failure answers); otherwise wait until it is available."""
        if manifests:
            write_manifests(
                apiservices_dir,
                "demo",
                apiservice or apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
                *backend_service(backend.port),
            )
        server = await start_gateway(**options)
        if force:
            force_available(server)
        elif manifests:
            await wait_available(server)
        session = aiohttp.ClientSession(auto_decompress=False)
        sessions.append(session)
        return Proxied(server, backend, pki, session)

    yield start
    for session in sessions:
        await session.close()
