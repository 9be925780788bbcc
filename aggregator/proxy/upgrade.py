"""Protocol upgrades (exec, attach, port-forward): SPDY/3.1 and WebSocket, tunnelled raw.

The request has been authenticated (and authorized) like any other by the time it gets here. The
gateway dials the backend itself (same TLS context and pinned address as ordinary requests),
sends the upgrade request with the caller's identity set on it and every spoofed identity header
removed, and reads the backend's answer:

- `101`: relay it verbatim and splice bytes both ways until either side closes;
- `>= 400`: relay the backend's answer, then close the client connection;
- anything else: 503 `invalid upgrade response: status code N`, then close.

An upgrade request that carries a body (`Content-Length` above 0, or `Transfer-Encoding`) is
refused with a 400 before anything is dialed. kube-apiserver forwards such a body; but a backend
that refuses the upgrade without reading it (Python's `http.server` does) would read that body as
a second request on the gateway's front-proxy connection, with whatever identity headers the
caller wrote into it. No kubectl or client-go upgrade (exec, attach, port-forward, WebSocket) has
a body.

The backend connection is never pooled and never reused, and the client connection is closed
whenever no tunnel was established, so bytes a client pipelines behind a refused upgrade are
never read as a second request (CVE-2018-1002105). Only `SPDY/3.1` and `websocket` are accepted
as protocols; other `Upgrade` values (h2c, tcp...) are refused with a 400 before anything is
dialed, and upgrades on paths that never serve them (discovery, health, metrics) are refused by
`refuse_upgrades` before they reach a handler.

The splice takes the client connection's raw bytes over through `ServerRequest.tunnel()`, which
only HTTP/1.1 offers (RFC 9113 has no `Upgrade`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.backends.errors import BackendError, Hop, classify
from aggregator.backends.h1 import UnsafeHead, serialize_head
from aggregator.backends.headers import request_headers, response_headers
from aggregator.contracts import Recheck
from aggregator.model.userinfo import UserInfo
from aggregator.proxy.destination import Destination
from aggregator.proxy.metrics import ProxyMetrics
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet
from aggregator.web.context import RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Answer, Response, Tunnel

log = logging.getLogger(__name__)

ALLOWED_PROTOCOLS = ("spdy/3.1", "websocket")
# How long a backend may take to answer the upgrade request (exec first reaches a kubelet).
RESPONSE_HEAD_TIMEOUT = 60.0
# A refused upgrade's body is relayed within these limits, then the connection is closed.
ERROR_BODY_LIMIT = 1 << 20
ERROR_RELAY_TIMEOUT = 10.0
_HIGH_WATER = 1 << 20
_CHUNK = 1 << 16


BODY_REFUSED = (
    "upgrade requests with a body are not supported: no exec, attach, port-forward or WebSocket "
    "upgrade sends one"
)


def has_body(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> bool:
    """Whether the request announces a body: `Transfer-Encoding`, or a `Content-Length` other than 0."""
    if "Transfer-Encoding" in headers:
        return True
    length = headers.get("Content-Length")
    return length is not None and length.strip() != "0"


def upgrade_refusal(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> str | None:
    """Why this upgrade is not tunnelled (a 400), or None when it may be."""
    if has_body(headers):
        return BODY_REFUSED
    protocols = [p.strip() for v in headers.getall("Upgrade", ()) for p in v.split(",") if p.strip()]
    if not protocols:
        return "the request asks for a protocol upgrade but names no protocol in Upgrade"
    for protocol in protocols:
        if protocol.lower() not in ALLOWED_PROTOCOLS:
            return f'upgrade to "{protocol}" is not supported: only SPDY/3.1 and websocket are tunnelled'
    return None


def upgrade_gate(metrics: ProxyMetrics) -> Callable[[RequestContext], Response | None]:
    """A pipeline gate: upgrade requests on routes that never serve them get a 400 (k/k#72113)."""

    def refuse_upgrades(ctx: RequestContext) -> Response | None:
        if not ctx.upgrade or ctx.route.upgradable:
            return None
        metrics.upgrade_rejected.labels("path").inc()
        response = status_response(
            ctx,
            400,
            f'upgrade requests are not allowed on path "{ctx.path}": only resource paths of '
            "aggregated APIs tunnel upgrades",
        )
        response.force_close()
        return response

    return refuse_upgrades


def _parse_head(head: bytes) -> tuple[int, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"malformed HTTP response {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    """A refused upgrade's body (Content-Length, chunked, or until EOF), at most ERROR_BODY_LIMIT."""
    values = CIMultiDict(headers)
    if "chunked" in values.get("Transfer-Encoding", "").lower():
        out = bytearray()
        while len(out) < ERROR_BODY_LIMIT:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                break
            out += await reader.readexactly(size)
            await reader.readexactly(2)
        return bytes(out[:ERROR_BODY_LIMIT])
    length = values.get("Content-Length")
    if length is not None and length.isdigit():
        return await reader.readexactly(min(int(length), ERROR_BODY_LIMIT))
    return await reader.read(ERROR_BODY_LIMIT)


class _ClientBytes:
    """Stands in for aiohttp's payload parser: every client byte goes to the backend as is."""

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        client: Tunnel,
        done: asyncio.Future[None],
        tasks: TaskSet,
    ) -> None:
        self._writer = writer
        self._client = client
        self._done = done
        self._tasks = tasks
        self._paused = False

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._writer.write(data)
        transport = self._writer.transport
        if not self._paused and transport.get_write_buffer_size() > _HIGH_WATER:
            # The backend reads slower than the client writes: stop reading the client until it drains.
            self._paused = True
            self._client.pause_reading()
            self._tasks.spawn(self._resume_when_drained(), name="resume-client")
        return False, b""

    async def _resume_when_drained(self) -> None:
        with contextlib.suppress(Exception):
            await self._writer.drain()
        self._paused = False
        with contextlib.suppress(Exception):
            self._client.resume_reading()

    def feed_eof(self) -> None:
        if not self._done.done():
            self._done.set_result(None)


class UpgradeTunnel:
    def __init__(
        self, metrics: ProxyMetrics, *, recheck: Recheck | None = None, in_flight: InFlight | None = None
    ) -> None:
        self.metrics = metrics
        # Told when a backend cannot be dialed or its TLS fails, as the forwarder tells it.
        self.recheck = recheck
        # Ends open tunnels on shutdown (web/longrunning.py).
        self.in_flight = in_flight or InFlight()

    async def serve(self, ctx: RequestContext, dest: Destination, user: UserInfo) -> Answer:
        name = dest.name
        backend = dest.backend
        protocol = ctx.headers.get("Upgrade", "")
        headers = request_headers(
            ctx.headers.items(),
            user,
            dest.identity.current(),
            authority=dest.authority,
            client_ip=ctx.remote,
            upgrade=protocol,
            impersonate=dest.impersonate,
            extra=dest.credentials,
            hop=dest.hop,
        )
        headers.popall("Expect", None)
        raw_path = ctx.target
        if not raw_path.startswith("/"):  # absolute-form request target
            raw_path = ctx.raw_path + ("?" + ctx.raw_query if ctx.raw_query else "")
        try:
            head = serialize_head(ctx.method, dest.base_path + raw_path, headers.items())
        except UnsafeHead as err:
            return status_response(ctx, 400, str(err))
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
        try:
            transport, stream_protocol = await backend.dial(
                dest.address, lambda: asyncio.StreamReaderProtocol(reader, loop=loop)
            )
        except BackendError as err:
            return self._error(ctx, name, err.cause, err.hop.value)
        writer = asyncio.StreamWriter(transport, stream_protocol, reader, loop)
        try:
            writer.write(head)
            async with asyncio.timeout(RESPONSE_HEAD_TIMEOUT):
                response_head = await reader.readuntil(b"\r\n\r\n")
                status, reason, response_fields = _parse_head(response_head)
            if status != 101:
                return await self._refused(ctx, name, status, reason, response_fields, reader)
            return await self._splice(ctx, response_head, reader, writer)
        except (
            OSError,
            TimeoutError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as err:
            hop, cause = classify(err, dest.authority)
            if isinstance(err, asyncio.IncompleteReadError):
                cause = "EOF"
            elif isinstance(err, ValueError | asyncio.LimitOverrunError):
                cause = str(err)
            hop, cause = await backend.diagnose(hop, cause, dest.address)
            return self._error(ctx, name, cause, hop.value)
        finally:
            # Never pooled, never reused: whatever the backend answered, this connection ends here.
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _refused(
        self,
        ctx: RequestContext,
        name: str,
        status: int,
        reason: str,
        fields_: list[tuple[str, str]],
        reader: asyncio.StreamReader,
    ) -> Response:
        self.metrics.upgrade_rejected.labels("non101").inc()
        log.info(
            "backend refused a protocol upgrade",
            extra=fields(apiservice=name, status=status, method=ctx.method, path=ctx.path),
        )
        if status < 400:
            response = status_response(ctx, 503, f"invalid upgrade response: status code {status}")
            response.force_close()
            return response
        try:
            async with asyncio.timeout(ERROR_RELAY_TIMEOUT):
                body = await _read_body(reader, fields_)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            body = b""
        headers = response_headers(fields_)
        headers.popall("Content-Length", None)
        relayed = Response(status, body, headers, reason=reason)
        relayed.force_close()
        return relayed

    async def _splice(
        self,
        ctx: RequestContext,
        response_head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> Answer:
        tunnel = ctx.request.tunnel()
        if tunnel is None or tunnel.closing:
            return status_response(ctx, 400, "this connection cannot carry an upgraded protocol")
        client_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tasks = TaskSet("upgrade")
        # Take the client's bytes before it can send any: it waits for the 101 first.
        tunnel.take_over(_ClientBytes(writer, tunnel, client_done, tasks))
        # The audit's ResponseStarted, as upstream's Hijack fakes it.
        ctx.head_going_out(101, CIMultiDict())
        await tunnel.write(response_head)
        pump = tasks.spawn(self._backend_to_client(reader, tunnel), name="backend-to-client")
        try:
            # Until either side closes, or the gateway shuts down: then both sides are closed.
            async with self.in_flight.ending():
                await asyncio.wait({pump, client_done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await tasks.close()
            tunnel.abort()
        return tunnel

    @staticmethod
    async def _backend_to_client(reader: asyncio.StreamReader, tunnel: Tunnel) -> None:
        with contextlib.suppress(OSError):  # either side reset: the tunnel ends
            while True:
                data = await reader.read(_CHUNK)
                if not data or tunnel.closing:
                    return
                await tunnel.write(data)

    def _error(self, ctx: RequestContext, name: str, cause: str, kind: str) -> Response:
        """Upstream's upgrade responder: 503 with the error itself (no `error trying to reach service`)."""
        self.metrics.backend_errors.labels(name, kind).inc()
        if self.recheck is not None and kind in (Hop.CONNECT, Hop.TLS):
            self.recheck.suspect(name)
        log.warning(
            "cannot open an upgraded connection to the backend",
            extra=fields(apiservice=name, hop=kind, path=ctx.path, reason=cause),
        )
        response = status_response(ctx, 503, cause)
        response.force_close()
        return response
