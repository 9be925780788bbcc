"""One HTTP/1.1 request as the pipeline sees it: a `ServerRequest` (`web/serverrequest.py`) over
the request aiohttp's C parser (llhttp) produced.

The head is aiohttp's: method, target, its path and query as sent, headers; the body is aiohttp's
StreamReader (reading pauses the connection when its buffer is full). Answers are written with
aiohttp's response writer, which frames them for HTTP/1.1 (Content-Length, or chunked when the
length is unknown), adds `Date`, and keeps or closes the connection: `respond` writes a whole
answer, `stream` starts one the handler writes (`Http1Answer`), and `tunnel` hands the raw
connection over after an upgrade's `101` (`Http1Tunnel`). `serve_http1` is the handler aiohttp's
low-level server calls: it wraps the request, runs the pipeline, and gives aiohttp back the
response that was written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.web.connection import HTTP1, Connection
from aggregator.web.http1.server import (
    GatewayRequest,
    GatewayResponse,
    GatewayStreamResponse,
    HeadersWithBody,
    RawBytesSink,
    drain,
    take_over,
)
from aggregator.web.serverrequest import (
    EncodedHeaders,
    HeadHook,
    RequestBody,
    Response,
    StreamedResponse,
    Tunnel,
)

# The pipeline's entry (`Pipeline.handle`).
PipelineEntry = Callable[[Any], Awaitable[Any]]


class Http1Answer:
    """An answer being written (`serverrequest.StreamedResponse`), over aiohttp's writer."""

    __slots__ = ("_request", "_response")

    def __init__(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        self._request = request
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> CIMultiDict[str]:
        return self._response.headers

    @property
    def body_length(self) -> int:
        return self._response.body_length

    # aiohttp's own coroutines, returned rather than awaited here: one coroutine less per call.
    def write(self, chunk: bytes) -> Coroutine[Any, Any, None]:
        return self._response.write(chunk)

    def finish(self, chunk: bytes = b"") -> Coroutine[Any, Any, None]:
        return self._response.write_eof(chunk)

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()

    @property
    def chunked(self) -> bool:
        """aiohttp chunks an answer of unknown length on its own (without `enable_chunked_encoding`)."""
        return "chunked" in self._response.headers.get("Transfer-Encoding", "")


class Http1Tunnel:
    """The connection after a `101`: raw bytes both ways (`serverrequest.Tunnel`)."""

    __slots__ = ("_request", "body_length", "headers", "status")

    def __init__(self, request: web.BaseRequest) -> None:
        self._request = request
        self.status = 101
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.body_length = 0

    def take_over(self, sink: RawBytesSink) -> None:
        take_over(self._request, sink)

    async def write(self, chunk: bytes) -> None:
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client connection is closed")
        transport.write(chunk)
        self.body_length += len(chunk)
        await drain(self._request)

    async def finish(self, chunk: bytes = b"") -> None:
        if chunk:
            await self.write(chunk)
        self.abort()

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()

    def pause_reading(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.resume_reading()

    @property
    def closing(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    @property
    def chunked(self) -> bool:
        return False


class Http1Request:
    """One HTTP/1.1 request (see the module docstring)."""

    __slots__ = (
        "_close",
        "_request",
        "body",
        "connection",
        "headers",
        "method",
        "on_head",
        "raw_path",
        "raw_query",
        "streamed",
        "target",
        "written",
    )

    def __init__(self, request: GatewayRequest, connection: Connection) -> None:
        self._request = request
        self.method = request.method
        self.target = request.raw_path  # aiohttp's raw_path is the whole target, query included
        url = request.rel_url
        self.raw_path = url.raw_path
        self.raw_query = url.raw_query_string
        self.headers: CIMultiDictProxy[str] = request.headers
        self.connection = connection
        self.body: RequestBody | None = request.content if request.body_exists else None
        self.on_head: HeadHook | None = None
        self.streamed: StreamedResponse | None = None
        # What was written, for aiohttp to finish (keep-alive, the end of a chunked body).
        self.written: web.StreamResponse | None = None
        self._close = False
        request.gateway_head = self  # aiohttp tells `on_head` of the head it is about to write

    async def respond(self, response: Response) -> None:
        out = GatewayResponse(
            body=response.body, status=response.status, reason=response.reason or None, headers=response.headers
        )
        if response.close or self._close:
            out.force_close()
        self.written = out
        await out.prepare(self._request)
        await out.write_eof()

    async def stream(
        self, status: int, headers: CIMultiDict[str], *, reason: str = "", head_now: bool = True
    ) -> StreamedResponse:
        cls = GatewayStreamResponse if head_now else HeadersWithBody
        out = cls(status=status, reason=reason or None, headers=headers)
        if self._close:
            out.force_close()
        self.written = out
        await out.prepare(self._request)
        answer = self.streamed = Http1Answer(self._request, out)
        return answer

    def tunnel(self) -> Tunnel | None:
        return Http1Tunnel(self._request)

    def add_encoded_headers(self, headers: CIMultiDict[str], encoded: EncodedHeaders) -> None:
        lines = encoded.lines
        if lines is None:  # a value the writer refuses: as any other header, refused the same way
            headers.extend(encoded.pairs)
        else:
            self._request.gateway_lines += lines

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()

    def close_connection(self, reason: str = "connection_close") -> None:
        self._close = True
        if self.written is not None:
            self.written.force_close()


def connection_of(request: web.BaseRequest) -> Connection:
    """The connection a request came on: recorded once by the server's protocol
    (`TimedRequestHandler`); a request that came another way gets a fresh record."""
    known = getattr(request.protocol, "gateway_connection", None)
    if isinstance(known, Connection):
        return known
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return Connection(request.remote, ssl_object, HTTP1)


def serve_http1(pipeline: PipelineEntry) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """The handler of aiohttp's low-level server: every request through `pipeline`."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        assert isinstance(request, GatewayRequest)
        wrapped = Http1Request(request, connection_of(request))
        await pipeline(wrapped)
        written = wrapped.written
        if written is None:  # nothing was answered (the pipeline always answers: a safety net)
            written = web.Response(status=500)
            written.force_close()
        return written

    return handle
