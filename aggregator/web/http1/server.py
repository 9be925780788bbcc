"""aiohttp's HTTP/1.1 server, with what the gateway needs and aiohttp does not have.

Every aiohttp internal the HTTP/1.1 side relies on is here (the client side's are in
`backends/_aiohttp.py`): a header-read timeout on its connections (`TimedServer`,
`TimedRequestHandler`), a TLS handshake deadline and a protocol factory of our own (`TimedSite`,
for the ALPN dispatch), responses without aiohttp's `Server` header that tell the request's
`ServerRequest` when their head is about to be written (`GatewayRequest`), responses whose head
ends with header lines encoded once (`GatewayResponse`, `GatewayStreamResponse`), headers sent with
the first body bytes (`HeadersWithBody`), and the raw connection after a `101` (`take_over`, the hook
`WebSocketResponse` uses). aiohttp's minor version is pinned in pyproject.toml for these;
`missing_internals()` is checked by tests/web/http1/test_aiohttp_internals.py so an upgrade that
breaks one fails loudly there, not in production.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_writer import StreamWriter
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

from aggregator.util.internals import missing_attributes

# Makes the gateway's record of a new client connection from its transport.
ConnectionFactory = Callable[[asyncio.BaseTransport], object]


class RawBytesSink(Protocol):
    """What receives a server connection's bytes once it is taken over (aiohttp calls it a parser)."""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]: ...

    def feed_eof(self) -> None: ...


class HeadHook(Protocol):
    """Whose `on_head` is told of a response's head just before it is written (the request's
    `ServerRequest`)."""

    on_head: Callable[[int, CIMultiDict[str]], None] | None


class _EncodedLines(web.StreamResponse):
    """A response whose head ends with its request's `gateway_lines`: header lines checked and
    encoded once (`serverrequest.EncodedHeaders`), not checked again character by character with
    every answer as the headers aiohttp serializes are."""

    async def _write_headers(self) -> None:
        # `StreamResponse._write_headers`, the lines appended before the head's empty line.
        request = self._req
        writer = self._payload_writer
        assert request is not None and writer is not None
        version = request.version
        status_line = f"HTTP/{version[0]}.{version[1]} {self._status} {self._reason}"
        await writer.write_headers(status_line, self._headers)
        lines = request.gateway_lines if isinstance(request, GatewayRequest) else b""
        if lines:
            head: Any = writer
            head._headers_buf = b"".join((head._headers_buf[:-2], lines, b"\r\n"))
        if self._send_headers_immediately:
            writer.send_headers()


class GatewayResponse(_EncodedLines, web.Response):
    """`web.Response`, its head ending with the request's encoded lines."""


class GatewayStreamResponse(_EncodedLines):
    """`web.StreamResponse`, its head ending with the request's encoded lines."""


class HeadersWithBody(GatewayStreamResponse):
    """A response whose headers go out with its first body bytes (one TLS record for a small one).

    For answers whose body is already on its way (a Content-Length was announced); a streamed one
    such as a watch must send its headers at once and uses a plain StreamResponse.
    """

    _send_headers_immediately = False


def take_over(request: web.BaseRequest, sink: RawBytesSink) -> None:
    """From now on every byte the client sends goes to `sink`, not to the HTTP parser."""
    protocol: Any = request.protocol
    protocol.set_parser(sink)


async def drain(request: web.BaseRequest) -> None:
    """Wait until a paused client transport can take more."""
    protocol: Any = request.protocol
    if protocol is not None and protocol.writing_paused:
        await protocol._drain_helper()


class GatewayRequest(web.Request):
    """A request whose responses go out without aiohttp's `Server: Python/3.x aiohttp/3.x`, and
    which tells the pipeline's context (`gateway_context`) when a response head is about to be
    written.

    kube-apiserver sends no `Server` header, and naming the exact versions helps nobody but an
    attacker. aiohttp adds it with `setdefault` while preparing any response, then calls this hook
    before writing the head; the one it added is recognised by identity (the very `SERVER_SOFTWARE`
    object), so a `Server` header relayed from a backend (parsed from its bytes: another object,
    even when an aiohttp backend sends the same text) is the backend's business and stays.
    """

    ATTRS = web.Request.ATTRS | frozenset(["gateway_head", "gateway_lines"])
    gateway_head: HeadHook | None = None
    # Header lines encoded once, for the end of its answer's head (`GatewayResponse`).
    gateway_lines = b""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        headers = response.headers
        if headers.get("Server") is SERVER_SOFTWARE:
            del headers["Server"]
        hook = self.gateway_head
        if hook is not None:
            on_head = hook.on_head
            if on_head is not None:
                on_head(response.status, headers)
        if self._match_info is not None:
            # An application's `on_response_prepare` signals. The gateway serves with aiohttp's
            # low-level server (no application, no match info): not another coroutine per answer.
            await super()._prepare_hook(response)


class TimedRequestHandler(RequestHandler):
    """aiohttp's server connection with Go's `http.Server.ReadHeaderTimeout`.

    aiohttp closes a connection waiting for a request only after its keep-alive timeout, counted
    from the connection's start or the last response, and never while a request head trickles in.
    Here a connection that has not completed a request head within `read_header_timeout` seconds
    of its start (for its first request) or of the first byte of the next one is closed, as Go's
    server does (`conn.readRequest`: the deadline is set before reading the head; a timeout ends
    the connection without an answer). A completed head clears the deadline; the body, the
    handler's time and an upgraded (taken over) connection are not bounded by it.
    """

    __slots__ = ("_connection_factory", "_header_handle", "_read_header_timeout", "gateway_connection")

    def __init__(
        self,
        manager: web.Server,
        *,
        read_header_timeout: float,
        connection_factory: ConnectionFactory | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._read_header_timeout = read_header_timeout
        self._connection_factory = connection_factory
        self._header_handle: asyncio.TimerHandle | None = None
        # What the gateway knows of this connection (`web.context.Connection`), made once.
        self.gateway_connection: object | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._connection_factory is not None:
            self.gateway_connection = self._connection_factory(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._clear_header_deadline()
        elif (
            data
            and self._header_handle is None
            and not self._request_in_progress
            and not self._messages
            and self._payload_parser is None
            and not self._upgraded
        ):
            self._arm_header_deadline()  # the first bytes of the next request head

    def connection_lost(self, exc: BaseException | None) -> None:
        self._clear_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._read_header_timeout > 0:
            self._header_handle = self._loop.call_later(self._read_header_timeout, self._header_deadline)

    def _clear_header_deadline(self) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None

    def _header_deadline(self) -> None:
        self._header_handle = None
        if self.transport is not None and not self._request_in_progress and not self._messages:
            self.force_close()


class TimedServer(web.Server):
    """aiohttp's low-level server whose connections have a header-read timeout (`TimedRequestHandler`).

    `handler_kwargs` go to each connection's handler, as `web.Server` passes them (keepalive_timeout,
    max_line_size...); kept here so nothing depends on how `web.Server` stores them.
    """

    def __init__(
        self,
        handler: Any,
        *,
        read_header_timeout: float,
        request_factory: Any = None,
        handler_cancellation: bool = False,
        connection_factory: ConnectionFactory | None = None,
        **handler_kwargs: Any,
    ) -> None:
        super().__init__(
            handler,
            request_factory=request_factory,
            handler_cancellation=handler_cancellation,
            **handler_kwargs,
        )
        self.read_header_timeout = read_header_timeout
        self.connection_factory = connection_factory
        self._handler_kwargs = handler_kwargs
        self._event_loop = asyncio.get_running_loop()

    def __call__(self) -> RequestHandler:
        return TimedRequestHandler(
            self,
            loop=self._event_loop,
            read_header_timeout=self.read_header_timeout,
            connection_factory=self.connection_factory,
            **self._handler_kwargs,
        )


class TimedSite(web.TCPSite):
    """`web.TCPSite` with a deadline on the TLS handshake, and a protocol factory of its own.

    Go bounds the handshake by the server's shortest read timeout (`http.Server.tlsHandshakeTimeout`:
    kube-apiserver's 32 s ReadHeaderTimeout); asyncio's default is 60 s, and aiohttp's site has no
    way to pass one. `protocol_factory` (default: the runner's server, aiohttp's HTTP/1.1 handler)
    makes each connection's protocol: the ALPN dispatch that may give it to HTTP/2 instead. Only
    `start` differs from aiohttp's.
    """

    __slots__ = ("_handshake_timeout", "_protocol_factory")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_handshake_timeout: float,
        protocol_factory: Callable[[], asyncio.BaseProtocol] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._handshake_timeout = ssl_handshake_timeout
        self._protocol_factory = protocol_factory

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol_factory or server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._handshake_timeout if self._ssl_context is not None else None,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def close_connections(server: web.Server) -> None:
    """Go's `Server.Shutdown` for the connections of a listener that just closed: idle ones (between
    requests, or that never sent one) close now, busy ones once their response is done.

    aiohttp's `RequestHandler.close` alone leaves an idle connection open (only its waiting task
    ends) until the runner's cleanup.
    """
    for protocol in server.connections:
        if protocol._request_in_progress or protocol._messages:
            protocol.close()
        else:
            protocol.force_close()


def missing_internals() -> list[str]:
    """The internals above this aiohttp no longer has (empty when all is well)."""
    handler = (
        "set_parser",
        "_drain_helper",
        "_request_count",
        "_request_in_progress",
        "_messages",
        "_payload_parser",
        "_upgraded",
        "_loop",
    )
    return missing_attributes(
        [
            *((RequestHandler, n) for n in handler),
            (web.StreamResponse, "_send_headers_immediately"),
            (web.StreamResponse, "_write_headers"),
            (web.BaseRequest, "_prepare_hook"),
            *((web.TCPSite, n) for n in ("_host", "_port", "_bound_port", "_reuse_address", "_reuse_port")),
            *((web.BaseSite, n) for n in ("_runner", "_ssl_context", "_backlog", "_server")),
        ]
    ) + _missing_fields()


def _missing_fields() -> list[str]:
    """The fields `_EncodedLines` reads (set by aiohttp's constructors, so not on the classes)."""
    response = web.StreamResponse()
    writer = StreamWriter(None, None)  # type: ignore[arg-type]  # only its fields are read
    return [
        f"{type(owner).__module__}.{type(owner).__qualname__}.{name}"
        for owner, names in ((response, ("_req", "_payload_writer", "_status", "_reason", "_headers")), (writer, ("_headers_buf",)))
        for name in names
        if not hasattr(owner, name)
    ]
