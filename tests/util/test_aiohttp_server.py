"""The listener's own hardening, over real TLS against a running gateway: slow clients are cut off
(kube-apiserver's ReadHeaderTimeout and IdleTimeout), and no response names aiohttp's version."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggregator.config import complete
from aggregator.runners.server import IDLE_TIMEOUT, READ_HEADER_TIMEOUT, GatewayServer
from tests.support.backend import (
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    wait_available,
    write_manifests,
)
from tests.support.fixtures import StartProxied
from tests.support.gateway import local_options
from tests.support.pki import PKI
from tests.support.polling import until

pytestmark = pytest.mark.long(20)

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
PARTIAL_HEAD = b"GET /livez HTTP/1.1\r\nHost: gateway\r\nUser-Agent: slow"
THINGS = f"{PREFIX}/namespaces/default/things"


def test_kube_apiservers_timeouts() -> None:
    """k8s.io/apiserver pkg/server/secure_serving.go: ReadHeaderTimeout 32s, IdleTimeout 90s."""
    assert (READ_HEADER_TIMEOUT, IDLE_TIMEOUT) == (32.0, 90.0)


StartTimed = Callable[..., Any]


@pytest.fixture
async def start_timed(pki: PKI, apiservices_dir: Path) -> AsyncIterator[StartTimed]:
    """`await start_timed(header=..., idle=...)`: a local-mode gateway with short timeouts."""
    async with AsyncExitStack() as stack:

        async def start(*, header: float, idle: float = 30.0) -> GatewayServer:
            server = GatewayServer(complete(local_options(pki, str(apiservices_dir))))
            server.read_header_timeout, server.idle_timeout = header, idle
            await server.start()
            stack.push_async_callback(server.stop)
            return server

        yield start


async def connect(server: GatewayServer, pki: PKI) -> Conn:
    return await asyncio.open_connection("127.0.0.1", server.port, ssl=pki.client_context())


async def closed_after(reader: asyncio.StreamReader, started: float, *, limit: float) -> float:
    """Seconds from `started` until the server closed the connection (reads and drops what comes)."""
    async with asyncio.timeout(limit):
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
    return time.monotonic() - started


async def get_livez(conn: Conn) -> bytes:
    reader, writer = conn
    writer.write(b"GET /livez HTTP/1.1\r\nHost: gateway\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head


async def test_a_request_head_that_never_completes_is_closed(start_timed: StartTimed, pki: PKI) -> None:
    server = await start_timed(header=0.5)
    started = time.monotonic()
    reader, writer = await connect(server, pki)
    writer.write(PARTIAL_HEAD)
    elapsed = await closed_after(reader, started, limit=5)
    assert 0.45 <= elapsed < 3


async def test_a_trickling_head_is_closed_at_the_same_deadline(start_timed: StartTimed, pki: PKI) -> None:
    """Slowloris: a byte every 100 ms does not extend the deadline."""
    server = await start_timed(header=0.6)
    started = time.monotonic()
    reader, writer = await connect(server, pki)
    closed = asyncio.ensure_future(closed_after(reader, started, limit=5))
    for byte in PARTIAL_HEAD * 4:
        if closed.done():
            break
        with contextlib.suppress(ConnectionError):
            writer.write(bytes([byte]))
        await asyncio.sleep(0.1)  # the slow client: one byte every 100 ms
    elapsed = await closed
    assert 0.55 <= elapsed < 3


async def test_a_silent_connection_is_closed_at_the_header_deadline(
    start_timed: StartTimed, pki: PKI
) -> None:
    server = await start_timed(header=0.5, idle=30)
    started = time.monotonic()
    reader, _writer = await connect(server, pki)
    assert 0.45 <= await closed_after(reader, started, limit=5) < 3


@pytest.mark.parametrize("hello", [b"", b"\x16\x03\x01\x02\x00\x01"], ids=["silent", "half-a-hello"])
async def test_a_tls_handshake_that_never_completes_is_closed(start_timed: StartTimed, hello: bytes) -> None:
    """Go bounds the handshake by the same deadline (http.Server.tlsHandshakeTimeout)."""
    server = await start_timed(header=0.5)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)  # plain TCP
    writer.write(hello)
    assert 0.45 <= await closed_after(reader, started, limit=5) < 3


async def test_between_requests_the_idle_timeout_applies_then_the_header_one(
    start_timed: StartTimed, pki: PKI
) -> None:
    server = await start_timed(header=0.4, idle=1.5)
    conn = await connect(server, pki)
    assert (await get_livez(conn)).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(0.7)  # idle longer than the header timeout: still open
    assert (await get_livez(conn)).startswith(b"HTTP/1.1 200")
    idle_from = time.monotonic()
    assert 1.4 <= await closed_after(conn[0], idle_from, limit=5) < 4  # then idle for too long

    reader, writer = await connect(server, pki)
    assert (await get_livez((reader, writer))).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(0.2)  # idle a while before the next head starts
    writer.write(PARTIAL_HEAD)  # the next head starts, and never ends
    started = time.monotonic()
    assert 0.35 <= await closed_after(reader, started, limit=5) < 1.0  # not the idle timeout's 1.3


async def test_slow_bodies_and_slow_answers_are_not_cut(
    start_timed: StartTimed,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    apiservices_dir: Path,
    pki: PKI,
) -> None:
    """Only the head is bounded: an upload that trickles, and an answer that takes its time (a
    watch), outlast both timeouts."""
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    server = await start_timed(header=0.3, idle=0.3)
    await wait_available(server)
    received: list[int] = []

    async def slow_answer(request: web.Request) -> web.StreamResponse:
        received.append(len(await request.read()))
        await asyncio.sleep(1.0)  # an answer slower than both timeouts
        return web.json_response({"ok": True})

    backend.routes[THINGS] = slow_answer

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(8):
            await asyncio.sleep(0.1)  # an upload that trickles past both timeouts
            yield b"x" * 10

    async with (
        aiohttp.ClientSession() as session,
        session.put(server.url + THINGS, data=trickle(), ssl=pki.client_context()) as resp,
    ):
        assert resp.status == 200
    assert received == [80]


async def test_two_thousand_slow_connections_do_not_slow_a_normal_client(
    start_timed: StartTimed, pki: PKI
) -> None:
    server = await start_timed(header=300, idle=300)
    client = aiohttp.ClientSession()
    ssl = pki.client_context()

    async def timings(rounds: int = 40) -> list[float]:
        out = []
        for _ in range(rounds):
            started = time.monotonic()
            async with client.get(server.url + "/livez", ssl=ssl) as resp:
                assert resp.status == 200
                await resp.read()
            out.append(time.monotonic() - started)
        return out

    slow: list[Conn] = []
    try:
        baseline = statistics.median(await timings())
        gate = asyncio.Semaphore(64)

        async def open_slow() -> None:
            async with gate:
                conn = await connect(server, pki)
                conn[1].write(PARTIAL_HEAD)
                slow.append(conn)

        await asyncio.gather(*(open_slow() for _ in range(2000)))
        runner = server._runner
        assert runner is not None and runner.server is not None
        assert len(runner.server.connections) >= 2000
        loaded = statistics.median(await timings())
        started = time.monotonic()
        fresh = await connect(server, pki)  # a new client: handshake and first answer
        assert (await get_livez(fresh)).startswith(b"HTTP/1.1 200")
        first_answer = time.monotonic() - started
        fresh[1].close()
    finally:
        await client.close()
        for _reader, writer in slow:
            writer.close()
    assert loaded < baseline * 5 + 0.05, (baseline, loaded)
    assert first_answer < 1.0


async def test_the_header_timeout_closes_hundreds_of_slow_connections(
    start_timed: StartTimed, pki: PKI
) -> None:
    server = await start_timed(header=1.0)

    async def one() -> float:
        started = time.monotonic()
        reader, writer = await connect(server, pki)
        writer.write(PARTIAL_HEAD)
        return await closed_after(reader, started, limit=30)  # 300 handshakes at once: slow when loaded

    elapsed = await asyncio.gather(*(one() for _ in range(300)))
    assert min(elapsed) >= 0.95
    runner = server._runner
    assert runner is not None and runner.server is not None
    server_side = runner.server
    await until(lambda: server_side.connections == [])


async def test_no_server_header_but_a_backends_own_is_relayed(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()

    async def own_server(_request: web.Request) -> web.StreamResponse:
        return web.json_response({}, headers={"Server": "wardle/1.0"})

    proxied.backend.routes[THINGS] = own_server
    for path in ("/livez", "/apis", "/version", "/nope", "/openapi/v2"):
        async with proxied.request("GET", path) as resp:
            assert "Server" not in resp.headers, path
    async with proxied.request("GET", "/apis", cert=None) as resp:  # a 401
        assert resp.status == 401 and "Server" not in resp.headers
    # aiohttp's own 400 for a request it cannot parse.
    reader, writer = await asyncio.open_connection("127.0.0.1", proxied.server.port, ssl=pki.client_context())
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert b" 400 Bad Request\r\n" in head and b"\r\nserver:" not in head.lower()
    # A backend's own Server header is the backend's answer: relayed as it is.
    async with proxied.request("GET", THINGS) as resp:
        assert resp.headers["Server"] == "wardle/1.0"
    # Even when the backend is an aiohttp that names itself exactly as aiohttp would name us.
    async with proxied.request("GET", f"{PREFIX}/namespaces/default/other") as resp:
        assert resp.headers["Server"].startswith("Python/") and "aiohttp/" in resp.headers["Server"]
