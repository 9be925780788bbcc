"""HTTP/2 streams through the real gateway: many requests on one connection, flow control both
ways, PING, resets that reach the backend, the stream limit, and the idle and preface deadlines.

The backend is the fake extension server behind a local-mode gateway; its handlers here hold
requests open until the test lets them go, so every check waits on a state (lockstep), not a delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from aggregator.runners.server import GatewayServer, shut_down
from aggregator.web.http2.connection import H2ServerConnection
from aggregator.web.http2.stream import H2Stream
from aggregator.web.options import ShutdownConfig
from tests.support.backend import PREFIX
from tests.support.fixtures import StartProxied
from tests.support.h2client import Goaway, H2Client
from tests.support.holding import Held, Watch
from tests.support.pki import PKI
from tests.support.polling import until

# The production loop: its TLS transport is no asyncio.Transport, and it reports failures its own way.
pytestmark = [pytest.mark.long(10), pytest.mark.uvloop]

THINGS = f"{PREFIX}/namespaces/default/things"


def h2_connections(server: GatewayServer) -> list[H2ServerConnection]:
    assert server.http2 is not None
    # Only H2ServerConnection registers itself; the set is typed by the protocol it uses.
    found = [c for c in server.http2.connections if isinstance(c, H2ServerConnection)]
    assert len(found) == len(server.http2.connections)
    return found


def accepted(server: GatewayServer, protocol: str) -> int:
    return int(server.connection_metrics.connections.labels(protocol)._value.get())


async def test_eight_concurrent_requests_share_one_connection(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        streams = [client.request("GET", THINGS) for _ in range(8)]
        await until(lambda: held.in_flight == 8, what="all 8 requests at the backend at once")
        held.release.set()
        answers = [await client.response(sid) for sid in streams]
    assert [a.status for a in answers] == [200] * 8
    assert accepted(proxied.server, "h2") == 1


async def test_curl_multiplexes_eight_transfers_on_one_connection(
    start_proxied: StartProxied, pki: PKI
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: apt-get install curl (.ci/run does)")
    proxied = await start_proxied()
    held = Held()
    proxied.backend.routes[THINGS] = held
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--http2", "--parallel", "--parallel-max", "8",
        "-w", "%{http_version} %{http_code}\n",
        "--cacert", pki.path("ca.crt"), "--cert", pki.path("admin.crt"), "--key", pki.path("admin.key"),
        *[arg for n in range(8) for arg in ("-o", "/dev/null", proxied.server.url + THINGS + f"?n={n}")],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await until(lambda: held.in_flight == 8, what="curl's 8 transfers at the backend at once")
    held.release.set()
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert out.decode().split("\n")[:-1] == ["2 200"] * 8
    assert accepted(proxied.server, "h2") == 1


async def test_the_stream_limit_is_kube_apiservers_and_the_flag_raises_it(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        await client.until(lambda: client.max_streams is not None)
        assert client.max_streams == 100
        assert client.remote_settings[SettingCodes.INITIAL_WINDOW_SIZE] == 256 * 1024
        assert client.remote_settings[SettingCodes.MAX_FRAME_SIZE] == 256 * 1024
        assert client.remote_settings[SettingCodes.MAX_HEADER_LIST_SIZE] == (1 << 20) + 320


async def test_a_thousand_watches_over_one_connection(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied(http2_max_streams_per_connection=1000)
    watch = Watch()
    proxied.backend.routes[THINGS] = watch
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        await client.until(lambda: client.max_streams == 1000)
        # In batches, as informers start: 1000 TLS handshakes to the backend at once (both ends in
        # this one test process) would outlast the gateway's 5 s dial timeout on a loaded machine,
        # and so did 100 at once with the suite on 4 workers at load average 16.
        streams: list[int] = []
        for opened in range(25, 1001, 25):
            streams += [client.request("GET", THINGS + "?watch=true") for _ in range(25)]
            # awaited here: the lambda never outlives this iteration's count
            await until(lambda: watch.open == opened, 60, f"{opened} watches open at the backend")  # noqa: B023
        await client.until(lambda: all(client.streams[s].body for s in streams), 60)
        assert all(client.streams[s].status == 200 for s in streams)
        assert accepted(proxied.server, "h2") == 1
        assert proxied.server.gateway.in_flight.long_running == 1000
        for sid in streams:
            client.reset(sid)
        await until(lambda: watch.open == 0, 60, "every watch closed at the backend")
    assert watch.cancelled == 1000


async def test_ping_is_answered(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        client.ping(b"client-g")
        await client.until(lambda: client.pings == [b"client-g"])


async def test_a_reset_stream_cancels_its_handler_and_closes_the_backend_request(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    watch = Watch()
    proxied.backend.routes[THINGS] = watch
    in_flight = proxied.server.gateway.in_flight
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        sid = client.request("GET", THINGS + "?watch=true")
        other = client.request("GET", "/livez")
        await client.until(lambda: bool(client.streams[sid].body))
        assert watch.open == 1 and in_flight.long_running == 1
        client.reset(sid)
        await until(lambda: watch.cancelled == 1, what="the backend's request cancelled")
        await until(lambda: in_flight.long_running == 0, what="the handler gone")
        assert (await client.response(other)).status == 200  # the connection goes on
        assert (await client.get("/livez")).status == 200
    code = proxied.server.gateway.metrics.pipeline.requests.labels("backend", "499")._value.get()
    assert code == 1  # counted as a client that went away, as on HTTP/1.1


class Firehose:
    """A backend watch that writes as fast as it may; `blocked` while a write waits for the
    gateway to read (the backend's transport paused, mid-write)."""

    CHUNK = b"x" * 65536

    def __init__(self, total: int) -> None:
        self.total = total
        self.written = 0
        self.writing = False
        self.protocol: Any = None

    @property
    def blocked(self) -> bool:
        return self.writing and self.protocol is not None and self.protocol.writing_paused

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.protocol = request.protocol
        while self.written < self.total:
            self.writing = True
            await response.write(self.CHUNK)
            self.writing = False
            self.written += len(self.CHUNK)
        return response


async def test_a_watch_to_a_slow_reader_respects_its_window_and_holds_the_backend(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    firehose = Firehose(total=256 * 1024 * 1024)
    proxied.backend.routes[THINGS] = firehose
    window = 16384
    settings: dict[int, int] = {SettingCodes.INITIAL_WINDOW_SIZE: window}
    async with H2Client.connect(
        proxied.server.port, pki.client_context("admin"), auto_ack=False, settings=settings
    ) as client:
        sid = client.request("GET", THINGS + "?watch=true")
        await client.until(lambda: len(client.streams[sid].body) == window)
        await until(lambda: firehose.blocked, 60, "the backend's writes held back")
        # The gateway sent exactly the window and reads the backend no further than its buffers:
        # the backend is held back long before the quarter gigabyte it wants to send.
        assert len(client.streams[sid].body) == window
        assert firehose.written < 32 * 1024 * 1024
        held_at = firehose.written
        # More window, more bytes: the stream is alive, only paced.
        client.acknowledge(sid, window)
        await client.until(lambda: len(client.streams[sid].body) == 2 * window)
        client.reset(sid)
    assert held_at <= firehose.written < 32 * 1024 * 1024


class Sink:
    """A backend route that reads none of the body it is sent until told to, then reads it all."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.read = asyncio.Event()
        self.ended: str | None = None  # how its read ended

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.arrived.set()
        try:
            await self.read.wait()
            await request.read()
            self.ended = "complete"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        except Exception as err:
            self.ended = type(err).__name__
        return web.Response()


async def test_an_upload_respects_the_gateways_window(start_proxied: StartProxied, pki: PKI) -> None:
    """A backend that never reads: the gateway's body buffer fills, it stops handing window back,
    and the client stalls with the gateway holding no more than its window and its buffer."""
    proxied = await start_proxied()
    sink = Sink()
    proxied.backend.routes[THINGS] = sink
    assert proxied.server.http2 is not None
    limits = proxied.server.http2.limits
    total = 128 * 1024 * 1024
    chunk = b"y" * 16384
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        sid = client.request("POST", THINGS, [("content-type", "application/json")], end=False)

        def gateway_stream() -> H2Stream | None:
            found = [c.streams.get(sid) for c in h2_connections(proxied.server)]
            return next((s for s in found if s is not None), None)

        def buffered() -> int:
            stream = gateway_stream()
            body = stream.body if stream is not None else None
            return sum(len(c) for c in body._chunks) if body is not None else 0

        def stalled() -> bool:
            return sink.arrived.is_set() and buffered() > 0

        sent = 0
        while sent < total:
            if client.h2.local_flow_control_window(sid) >= len(chunk):
                client.send_data(sid, chunk)
                sent += len(chunk)
                continue
            await until(lambda: client.h2.local_flow_control_window(sid) >= len(chunk) or stalled(), 60)
            if client.h2.local_flow_control_window(sid) < len(chunk):
                break
        assert sent < total
        assert buffered() <= limits.stream_window
        client.reset(sid)
        # The backend reads what is buffered for it, then finds the connection gone: its request
        # ends (it would wait forever for the rest of the body if the gateway kept it open).
        sink.read.set()
        await until(lambda: sink.ended is not None, what="the backend's request ended")
        assert sink.ended != "complete"


async def test_an_idle_connection_gets_goaway_after_the_idle_timeout(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    serving = proxied.server.http2
    assert serving is not None
    serving.limits = replace(serving.limits, idle_timeout=0.3, preface_timeout=0.1)
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        assert (await client.get("/livez")).status == 200
        await client.until(lambda: client.goaway is not None)
        assert client.goaway is not None
        assert client.goaway.error_code == ErrorCodes.NO_ERROR and client.goaway.last_stream_id == 1
        await client.until(lambda: client.closed)


async def test_a_client_that_sends_no_preface_is_closed(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    serving = proxied.server.http2
    assert serving is not None
    serving.limits = replace(serving.limits, preface_timeout=0.2)
    context = pki.client_context("admin")
    context.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection("127.0.0.1", proxied.server.port, ssl=context)
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        while await asyncio.wait_for(reader.read(65536), 10):
            pass  # the gateway's SETTINGS, then the end
    writer.close()


async def test_shutdown_sends_goaway_drains_streams_and_ends_watches_cleanly(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    held, watch = Held(), Watch()
    watched = f"{PREFIX}/namespaces/other/things"
    proxied.backend.routes[THINGS] = held
    proxied.backend.routes[watched] = watch
    server = proxied.server
    async with H2Client.connect(server.port, pki.client_context("admin")) as client:
        plain = client.request("GET", THINGS)
        watching = client.request("GET", watched + "?watch=true")
        await until(lambda: held.in_flight == 1, what="the plain request at the backend")
        await client.until(lambda: bool(client.streams[watching].body))
        stopping = asyncio.ensure_future(shut_down(server, ShutdownConfig(request_grace=30)))
        await client.until(lambda: client.goaway is not None)
        assert client.goaway == Goaway(watching, ErrorCodes.NO_ERROR)
        # The watch ends as over HTTP/1.1: its answer is complete (END_STREAM), not reset.
        await client.until(
            lambda: client.streams[watching].ended or client.streams[watching].reset is not None
        )
        assert client.streams[watching].reset is None
        # A stream opened after the GOAWAY is not served (Go's server ignores it too): the GOAWAY
        # told the client to retry it on a new connection.
        late = client.request("GET", "/livez")
        # The request in flight is served to the end, then the connection closes.
        assert not stopping.done()
        held.release.set()
        assert (await client.response(plain)).status == 200
        await asyncio.wait_for(stopping, 30)
        await client.until(lambda: client.closed)
        assert client.streams[late].status is None
    assert server.connection_metrics.goaways.labels("shutdown")._value.get() == 1
