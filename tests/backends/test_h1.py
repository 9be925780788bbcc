"""The lean HTTP/1.1 client: keep-alive reuse, no cap on connections in use, bounded idle ones
(per address and across every backend's pool)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator

import pytest

from aggregator.backends.backend import Address, Backend
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.h1 import H1Pool, IdleConnections, UnsafeHead, serialize_head
from tests.support.polling import until


class PlainServer:
    """HTTP/1.1 over plain TCP: `/get` answers with a body, `/close` asks to close, `/hold` never ends."""

    def __init__(self) -> None:
        self.connections = 0
        self.open = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=2048)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path == b"/hold":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                    await writer.drain()
                    await reader.read()  # until the client goes away
                    return
                if path == b"/close":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    await writer.drain()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.open -= 1
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[PlainServer]:
    plain = PlainServer()
    await plain.start()
    yield plain
    await plain.stop()


def backend(idle: IdleConnections | None = None, **pool: float) -> Backend:
    made = Backend("plain", context=None, idle=idle)
    for name, value in pool.items():
        setattr(made.pool, name, value)
    return made


async def get(pool: H1Pool, port: int, path: str = "/get") -> bytes:
    exchange = await pool.exchange("127.0.0.1", port, None)
    try:
        exchange.send(serialize_head("GET", path, [("Host", "x")]), None, chunked=False, head_only=False)
        _message, payload = await exchange.response()
        return await payload.read()
    finally:
        exchange.finish()


async def test_sequential_requests_share_one_connection(server: PlainServer) -> None:
    pool = backend().pool
    for _ in range(10):
        assert await get(pool, server.port) == b"hello"
    assert server.connections == 1 and pool.idle_count() == 1 and pool.in_use == 0


async def test_a_connection_the_server_closes_is_not_reused(server: PlainServer) -> None:
    pool = backend().pool
    assert await get(pool, server.port, "/close") == b"ok"
    assert pool.idle_count() == 0
    assert await get(pool, server.port) == b"hello"
    assert server.connections == 2


async def test_idle_connections_expire_after_the_keepalive(server: PlainServer) -> None:
    pool = backend(keepalive=0.05).pool
    await get(pool, server.port)
    await asyncio.sleep(0.1)  # the keep-alive must pass: time, not an event
    await get(pool, server.port)
    assert server.connections == 2


async def test_idle_connections_beyond_the_bound_are_closed(server: PlainServer) -> None:
    pool = backend(max_idle=2).pool
    await asyncio.gather(*(get(pool, server.port) for _ in range(5)))
    assert server.connections == 5
    assert pool.idle_count() == 2


async def test_a_retired_backend_closes_connections_as_their_exchange_ends(server: PlainServer) -> None:
    made = backend()
    await get(made.pool, server.port)
    exchange = await made.pool.exchange("127.0.0.1", server.port, None)
    made.retire()
    assert made.pool.idle_count() == 0
    exchange.send(serialize_head("GET", "/get", [("Host", "x")]), None, chunked=False, head_only=False)
    _message, payload = await exchange.response()
    assert await payload.read() == b"hello"  # the request in flight completes
    exchange.finish()
    assert made.pool.idle_count() == 0 and not exchange.protocol.is_connected()


async def test_no_cap_on_connections_in_use_a_get_beside_many_watches_answers_at_once(
    server: PlainServer,
) -> None:
    """Go's transport has no per-host limit (client-go sets none): 600 open watches on one
    backend, more than the 512 that used to block, and a plain GET still gets its own connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400 and (hard == resource.RLIM_INFINITY or hard >= 1400):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1400, hard))  # both ends of 600 connections
        soft = 1400
    watches = min(600, (soft - 100) // 2)
    assert watches > 512, f"the open-files limit ({soft}) is too low for this test"
    made = backend()
    held = []
    try:
        for _ in range(watches):
            exchange = await made.pool.exchange("127.0.0.1", server.port, None)
            exchange.send(serialize_head("GET", "/hold", [("Host", "x")]), None, chunked=False, head_only=False)
            _message, payload = await exchange.response()
            assert await payload.readany() == b"first"
            held.append(exchange)
        async with asyncio.timeout(2):
            assert await get(made.pool, server.port) == b"hello"
        assert made.pool.in_use == watches
    finally:
        for exchange in held:
            exchange.finish()


async def test_dial_failures_read_like_go(server: PlainServer) -> None:
    made = backend()
    await server.stop()
    with pytest.raises(BackendError) as err:
        await made.dial(Address("127.0.0.1", server.port, None), asyncio.Protocol)
    assert err.value.hop is Hop.CONNECT
    assert err.value.cause == f"dial tcp 127.0.0.1:{server.port}: connect: connection refused"


async def test_spare_idle_connections_close_but_the_warm_one_stays(server: PlainServer) -> None:
    pool = backend(spare_keepalive=0.05).pool
    await asyncio.gather(*(get(pool, server.port) for _ in range(4)))  # a burst: four connections
    assert pool.idle_count() == 4
    await asyncio.sleep(0.1)  # the spares' keep-alive must pass: time, not an event
    assert await get(pool, server.port) == b"hello"  # reuses the newest; the stale spares close
    assert pool.idle_count() == 1
    await until(lambda: server.open == 1, what="the spares closed at the backend")


async def test_an_idle_connection_closes_at_its_keepalive_without_another_request(server: PlainServer) -> None:
    """A backend nobody calls again holds no connection once its keep-alive is over (the pool
    used to notice only at the next request to that address)."""
    pool = backend(keepalive=0.1).pool
    assert await get(pool, server.port) == b"hello"
    assert server.open == 1
    await until(lambda: server.open == 0, what="the idle connection closed at its keep-alive")
    assert pool.idle_count() == 0 and len(pool.everyone_idle) == 0


async def test_idle_connections_across_backends_are_bounded_oldest_first(server: PlainServer) -> None:
    """Thousands of backends share one bound on idle connections: beyond it the connection idle
    longest closes, whichever backend it leads to."""
    idle = IdleConnections(limit=3)
    first, second = backend(idle).pool, backend(idle).pool
    await asyncio.gather(*(get(first, server.port) for _ in range(3)))  # a burst: three idle
    assert (first.idle_count(), server.open) == (3, 3)
    await asyncio.gather(*(get(second, server.port) for _ in range(2)))  # two more, elsewhere
    assert (first.idle_count(), second.idle_count(), len(idle)) == (1, 2, 3)
    await until(lambda: server.open == 3, what="the two oldest closed at the backend")
    assert await get(first, server.port) == b"hello"  # the newest of the first burst is reused
    assert server.connections == 5


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/apis/x/v1/things /../secrets", []),
        ("GET", "/apis/x/v1/things\t", []),
        ("GET X", "/apis/x/v1/things", []),
        ("GET", "/apis/x/v1/things", [("X-Note", "ok\r\nX-Remote-User: admin")]),
        ("GET", "/apis/x/v1/things", [("X-Note", "ok\nX-Remote-User: admin")]),
        ("GET", "/apis/x/v1/things", [("X-Note\r\nX-Remote-User", "admin")]),
        ("GET", "/apis/x/v1/things", [("X-Note", "ok\x00")]),
        ("GET", "/apis/x/v1/things", [("X-Note", "ok\rX-Remote-User: admin")]),
    ],
)
def test_a_head_that_would_reach_the_backend_as_another_request_is_never_written(
    method: str, target: str, headers: list[tuple[str, str]]
) -> None:
    """The last check where bytes become a request, whatever the protocol modules let through."""
    with pytest.raises(UnsafeHead):
        serialize_head(method, target, [("Host", "backend"), *headers])


def test_a_plain_head_is_written_as_given() -> None:
    assert serialize_head("GET", "/apis/x/v1/things?a=b", [("Host", "backend"), ("X-Note", "a b")]) == (
        b"GET /apis/x/v1/things?a=b HTTP/1.1\r\nHost: backend\r\nX-Note: a b\r\n\r\n"
    )
