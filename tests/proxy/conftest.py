"""The proxy tests' shared gateway: local mode in front of a raw HTTP/1.1 backend (upgrades)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aggregator.runners.server import GatewayServer
from tests.conftest import StartGateway
from tests.support.backend import (
    SERVER_NAME,
    BackendPKI,
    RawBackend,
    Received,
    apiservice_manifest,
    backend_service,
    force_available,
    write_manifests,
)
from tests.support.pki import PKI

RawRespond = Callable[[RawBackend, asyncio.StreamReader, asyncio.StreamWriter, Received], Awaitable[None]]


# `await raw_gateway(respond, **option_overrides)` -> (a running gateway, the raw backend behind it)
RawGateway = Callable[..., Awaitable[tuple[GatewayServer, RawBackend]]]


@pytest.fixture
async def raw_gateway(
    start_gateway: StartGateway, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> AsyncIterator[RawGateway]:
    backends: list[RawBackend] = []

    async def start(respond: RawRespond, **options: object) -> tuple[GatewayServer, RawBackend]:
        cert, key = backend_pki.serving("raw", [SERVER_NAME])
        raw = RawBackend(cert, key, pki.path("front-proxy-ca.crt"), respond)
        backends.append(raw)
        port = await raw.start()
        write_manifests(
            apiservices_dir,
            "demo",
            apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem),
            *backend_service(port),
        )
        server = await start_gateway(**options)
        # The raw backend answers no discovery: tell the proxy the APIService is available anyway.
        force_available(server)
        return server, raw

    yield start
    for raw in backends:
        await raw.stop()


