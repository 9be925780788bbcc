"""Every aiohttp internal the gateway relies on, in one place.

The proxy's hot path and its upgrade splice need a few things aiohttp does not publish: reading a
backend's answer with aiohttp's own C parser on a connection we manage (`ResponseHandler`),
waiting for a paused transport to drain, sending a response's headers together with its first body
bytes, and taking over a server connection's raw bytes after a `101` (the hook `WebSocketResponse`
uses). The listener needs three more: a header-read timeout on its connections
(`TimedServer`), which aiohttp does not have, a TLS handshake deadline (`TimedSite`), and responses
without aiohttp's `Server` header (`GatewayRequest`). The HTTP/2 streams (`web/http2/`) are served
as aiohttp requests built from a head aiohttp's parser never saw (`stream_request`). aiohttp's minor version is pinned in pyproject.toml for these;
`missing_internals()` is checked by tests/util/test_aiohttp_internals.py so an upgrade that breaks
one fails loudly there, not in production.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import SERVER_SOFTWARE, HttpVersion, RawRequestMessage, RawResponseMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = [
    "EMPTY_PAYLOAD",
    "HTTP2",
    "AbstractStreamWriter",
    "ConnectionFactory",
    "GatewayRequest",
    "HeadersWithBody",
    "RawResponseMessage",
    "ResponseHandler",
    "ResponseHeadHook",
    "StreamReader",
    "TimedServer",
    "TimedSite",
    "close_connections",
    "drain",
    "missing_internals",
    "response_protocol",
    "stream_request",
    "take_over_connection",
]


HTTP2 = HttpVersion(2, 0)
# The fields of the parsed head aiohttp's request is built from (checked by `missing_internals`).
REQUEST_MESSAGE_FIELDS = (
    "method", "path", "version", "headers", "raw_headers", "should_close", "compression", "upgrade",
    "chunked", "url",
)  # fmt: skip

# Makes the gateway's record of a new client connection from its transport.
ConnectionFactory = Callable[[asyncio.BaseTransport], object]


class RawBytesSink(Protocol):
    """What receives a server connection's bytes once it is taken over (aiohttp calls it a parser)."""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]: ...

    def feed_eof(self) -> None: ...


def response_protocol(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    """aiohttp's client protocol: the llhttp response parser feeding a StreamReader per body."""
    return ResponseHandler(loop)


def prepare_response(protocol: ResponseHandler, *, head_only: bool, read_bufsize: int, max_line: int) -> None:
    """Set up `protocol` to parse the next answer without decompressing or limiting its headers.

    A keep-alive connection goes back to its pool only after a complete answer, where aiohttp's
    response parser stands ready for the next one (as a server's parser does between requests):
    the parser the previous exchange set up with the same settings is kept rather than built
    again for every request (about 2% of a proxied request's CPU).
    """
    settings = (head_only, read_bufsize, max_line)
    if protocol._parser is not None and getattr(protocol, "_gateway_settings", None) == settings:
        return
    protocol._gateway_settings = settings  # type: ignore[attr-defined]
    protocol.set_response_params(
        skip_payload=head_only,
        # No Content-Length and not chunked: the body runs to the end of the connection.
        read_until_eof=True,
        auto_decompress=False,
        read_bufsize=read_bufsize,
        max_line_size=max_line,
        max_field_size=max_line,
    )


async def drain(protocol: Any) -> None:
    """Wait until a paused transport (client or server side) can take more bytes."""
    if protocol.writing_paused:
        await protocol._drain_helper()


class HeadersWithBody(web.StreamResponse):
    """A response whose headers go out with its first body bytes (one TLS record for a small one).

    For answers whose body is already on its way (a Content-Length was announced); a streamed one
    such as a watch must send its headers at once and uses a plain StreamResponse.
    """

    _send_headers_immediately = False


def take_over_connection(request: web.BaseRequest, sink: RawBytesSink) -> None:
    """From now on every byte the client sends goes to `sink`, not to the HTTP parser."""
    protocol: Any = request.protocol
    protocol.set_parser(sink)


class ResponseHeadHook(Protocol):
    """Told of a response just before its head is written (`web.context.RequestContext`)."""

    def head_going_out(self, status: int, response: web.StreamResponse | None) -> None: ...


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

    ATTRS = web.Request.ATTRS | frozenset(["gateway_context"])
    gateway_context: ResponseHeadHook | None = None

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        headers = response.headers
        if headers.get("Server") is SERVER_SOFTWARE:
            del headers["Server"]
        context = self.gateway_context
        if context is not None:
            context.head_going_out(response.status, response)
        await super()._prepare_hook(response)


def stream_request(
    request_class: type[web.Request],
    *,
    method: str,
    target: str,
    headers: CIMultiDict[str],
    payload: StreamReader,
    protocol: Any,
    writer: AbstractStreamWriter,
    task: Any,
    loop: asyncio.AbstractEventLoop,
    client_max_size: int,
) -> web.Request:
    """An aiohttp request for a head that did not come through aiohttp's HTTP/1.1 parser.

    `protocol` stands in for aiohttp's `RequestHandler`: the request reads its `ssl_context`,
    `peername`, `sockname` and `transport`, and the body's StreamReader calls its `pause_reading`,
    `resume_reading` and `connected`. The target is an origin-form path (or `*`), and its URL is
    built as aiohttp's parser builds one, so `raw_path` and the query read the same as over HTTP/1.1.
    """
    if target.startswith("/"):
        path, _, fragment = target.partition("#")
        path, _, query = path.partition("?")
        url = URL.build(path=path, query_string=query, fragment=fragment, encoded=True)
    else:
        url = URL(target, encoded=True)
    message = RawRequestMessage(
        method, target, HTTP2, CIMultiDictProxy(headers), (), False, None, False, False, url
    )
    return request_class(message, payload, protocol, writer, task, loop, client_max_size=client_max_size)


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
    missing = []
    for owner, name in (
        (ResponseHandler, "set_response_params"),
        (ResponseHandler, "read"),
        (ResponseHandler, "writing_paused"),
        (ResponseHandler, "_drain_helper"),
        (RequestHandler, "set_parser"),
        (RequestHandler, "_drain_helper"),
        (RequestHandler, "_request_count"),
        (RequestHandler, "_request_in_progress"),
        (RequestHandler, "_messages"),
        (RequestHandler, "_payload_parser"),
        (RequestHandler, "_upgraded"),
        (RequestHandler, "_loop"),
        (web.StreamResponse, "_send_headers_immediately"),
        (web.BaseRequest, "_prepare_hook"),
        *((web.TCPSite, n) for n in ("_host", "_port", "_bound_port", "_reuse_address", "_reuse_port")),
        *((web.BaseSite, n) for n in ("_runner", "_ssl_context", "_backlog", "_server")),
    ):
        if not hasattr(owner, name):
            missing.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
    # The parsed head, in the C parser's class or the pure-Python NamedTuple: built positionally.
    message = RawRequestMessage(*REQUEST_MESSAGE_FIELDS)  # type: ignore[arg-type]
    if [getattr(message, name, None) for name in REQUEST_MESSAGE_FIELDS] != list(REQUEST_MESSAGE_FIELDS):
        missing.append(f"aiohttp.http.RawRequestMessage{REQUEST_MESSAGE_FIELDS}")
    return missing
