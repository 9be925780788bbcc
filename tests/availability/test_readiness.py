"""`/readyz` waits for the first availability verdicts, and only for those, and only so long.

Right after start the proxy would answer from the objects' own conditions until the checker's
first round lands; the `apiservice-availability-synced` check keeps the replica out of its Service
meanwhile. A dead backend must never make the gateway unready: any verdict counts, and the wait
is bounded by one probe timeout (5 s) plus a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from aggregator.assembly import build_gateway
from aggregator.availability.checker import FIRST_ROUND_CHECK, AvailabilityChecker
from aggregator.availability.probe import TIMEOUT
from aggregator.config import complete
from aggregator.runners.server import GatewayServer
from tests.conftest import StartGateway
from tests.support.backend import apiservice_manifest, backend_service, write_manifests
from tests.support.gateway import local_options
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until, until_async

NAME = "v1.demo.example.com"


class HangingBackend:
    """Accepts TCP connections and never says a word: every check waits for its timeout."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.first_at: float | None = None  # time.monotonic() of the first connection: a probe's start
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.first_at is None:
            self.first_at = time.monotonic()
        self._writers.append(writer)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def hanging() -> AsyncIterator[HangingBackend]:
    backend = HangingBackend()
    await backend.start()
    yield backend
    await backend.stop()


def register(folder: Path, stem: str, port: int) -> None:
    write_manifests(folder, stem, apiservice_manifest(port=port, ca_pem=None), *backend_service(port))


Get = Callable[[str], Awaitable[tuple[int, str]]]


@pytest.fixture
async def get(pki: PKI) -> AsyncIterator[Callable[[GatewayServer], Get]]:
    async with aiohttp.ClientSession() as session:

        def for_server(server: GatewayServer) -> Get:
            async def get(path: str) -> tuple[int, str]:
                async with session.get(server.url + path, ssl=pki.client_context()) as resp:
                    return resp.status, await resp.text()

            return get

        yield for_server


async def test_ready_once_the_first_round_lands_even_with_a_dead_backend(
    start_gateway: StartGateway,
    apiservices_dir: Path,
    hanging: HangingBackend,
    get: Callable[[GatewayServer], Get],
) -> None:
    register(apiservices_dir, "demo", hanging.port)
    server = await start_gateway()
    call = get(server)

    status, body = await call("/readyz?verbose")
    assert status == 500
    assert f"[-]{FIRST_ROUND_CHECK} failed: reason withheld\n" in body
    assert "[+]apiservice-registry-synced ok\n" in body
    status, body = await call(f"/readyz/{FIRST_ROUND_CHECK}")
    assert (status, body) == (500, f"internal server error: no availability verdict yet for {NAME}\n")
    assert (await call("/livez"))[0] == 200  # not ready is not unhealthy

    # Timed from the probe's connection, not from start-up (which a loaded machine drags out).
    await until(lambda: hanging.first_at is not None, what="the first probe's connection")
    assert hanging.first_at is not None
    probed = hanging.first_at
    # Still waiting while the check itself waits for the silent backend (the probe timeout is
    # time, not an event: a negative check up to just before it)...
    await asyncio.sleep(max(0.0, probed + TIMEOUT - 1.5 - time.monotonic()))
    assert (await call("/readyz"))[0] == 500

    # ...and ready as soon as its verdict (unavailable) lands: one probe timeout, not more.
    async def ready() -> bool:
        return (await call("/readyz"))[0] == 200

    await until_async(ready, max(0.0, probed + TIMEOUT + 1.5 - time.monotonic()), "ready after the first round")
    assert time.monotonic() - probed >= TIMEOUT - 0.5
    assert hanging.connections >= 1

    status, body = await call("/readyz?verbose")
    assert status == 200
    assert f"[+]{FIRST_ROUND_CHECK} ok\n" in body
    assert f"warn: APIService {NAME} is unavailable: FailedDiscoveryCheck: " in body
    assert body.endswith("readyz check passed\n")
    checker = server.gateway.control.availability
    assert isinstance(checker, AvailabilityChecker) and not checker.is_available(NAME)

    # Only the APIServices present at start-up are waited for: a new dead one changes nothing.
    later = apiservice_manifest(port=hanging.port, ca_pem=None, group="later.example.com")
    write_manifests(apiservices_dir, "later", later)  # the same dead Service

    async def listed_and_still_ready() -> bool:
        assert (await call("/readyz"))[0] == 200
        return server.gateway.store.apiservice("v1.later.example.com") is not None

    await until_async(listed_and_still_ready, what="the later APIService listed")
    assert (await call("/readyz"))[0] == 200
    assert checker.verdict("v1.later.example.com") is None  # still being checked


async def test_a_refused_backend_is_a_verdict_at_once(
    pki: PKI, apiservices_dir: Path, get: Callable[[GatewayServer], Get]
) -> None:
    hanging = HangingBackend()
    port = await hanging.start()
    await hanging.stop()  # nothing listens there any more: connection refused
    register(apiservices_dir, "demo", port)
    options = local_options(pki, str(apiservices_dir))
    config = complete(options)
    gateway = build_gateway(config)
    # readiness would wait an hour for a missing verdict: being ready at all means the refusal was one
    gateway.control.availability.first_round_limit = 3600
    server = GatewayServer(config, gateway)
    await server.start()
    try:
        call = get(server)

        async def ready() -> bool:
            return (await call("/readyz"))[0] == 200

        await until_async(ready, 60, "ready", every=0.02)
        _, body = await call("/readyz?verbose")
    finally:
        await server.stop()
    assert f"[+]{FIRST_ROUND_CHECK} ok\n" in body
    assert "connect: connection refused" in body


async def test_the_wait_is_bounded(
    pki: PKI,
    apiservices_dir: Path,
    hanging: HangingBackend,
    get: Callable[[GatewayServer], Get],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Checks that never end (here: a limit shorter than the probe timeout) do not hold readiness."""
    register(apiservices_dir, "demo", hanging.port)
    options = local_options(pki, str(apiservices_dir))
    config = complete(options)
    gateway = build_gateway(config)
    checker = gateway.control.availability
    assert isinstance(checker, AvailabilityChecker)
    checker.first_round_limit = 0.5
    checker.probe.timeout = 3600  # without the limit, readiness would wait an hour for the verdict
    caplog.set_level(logging.WARNING, logger="aggregator.availability.checker")
    server = GatewayServer(config, gateway)
    started = time.monotonic()
    await server.start()
    try:
        call = get(server)

        async def ready() -> bool:
            return (await call("/readyz"))[0] == 200

        await until_async(ready, max(0.0, started + 60 - time.monotonic()), "ready", every=0.02)
        assert checker.verdict(NAME) is None  # its check is still waiting for the backend
        warned = [r for r in caplog.records if "ready without a first availability verdict" in r.getMessage()]
        assert len(warned) == 1 and fields_of(warned[0]) == {"apiservices": NAME}
    finally:
        await server.stop()
