"""One HTTP/2 stream, served as the aiohttp request the pipeline already serves over HTTP/1.1.

The pipeline and its handlers read a request (head, body stream, the connection's identity) and
write an aiohttp response; a stream gives them exactly that:

- `H2Stream` plays the parts aiohttp's connection plays for an HTTP/1.1 request: the request's
  "protocol" (the TLS session and peer of its connection, `web.context.Connection`; the body's
  flow control: reading pauses when the body buffer is full, and only bytes read are handed back
  to the client as window), and its "transport", whose `close()` resets this stream alone (where
  HTTP/1.1 closes the connection to cut an answer short, as Go's server answers
  `http.ErrAbortHandler`: RST_STREAM INTERNAL_ERROR).
- `ResponseWriter` is the response's payload writer: the head becomes a HEADERS frame (with
  END_STREAM when nothing follows), the body DATA frames within the client's flow-control windows,
  so a slow reader holds its writer (a watch's relay, and through it the backend connection)
  instead of filling memory.

A stream the client resets cancels its handler; a handler that ends before its answer did resets
the stream.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any, Protocol

from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError

from aggregator.util._aiohttp import AbstractStreamWriter, StreamReader
from aggregator.web.context import Connection
from aggregator.web.http2.heads import response_fields

if TYPE_CHECKING:
    from multidict import CIMultiDict

# aiohttp's defaults for multipart fields (never used by the gateway; read by aiohttp's request).
MAX_FIELD_SIZE = 8190
MAX_HEADERS = 128


class StreamConnection(Protocol):
    """What a stream needs of its connection (`connection.H2ServerConnection`)."""

    h2: H2Connection
    info: Connection
    ssl_context: ssl.SSLContext | None
    peername: Any
    sockname: Any
    transport: asyncio.Transport | None
    writing_paused: bool
    waiting_for_window: set[H2Stream]

    def flush(self) -> None: ...

    async def drain(self) -> None: ...

    def acknowledge(self, stream_id: int, size: int) -> None: ...

    def reset_stream(self, stream: H2Stream, code: ErrorCodes) -> None: ...

    def shut_down(self, reason: str = ...) -> None: ...


class StreamReset(ConnectionResetError):
    """The stream was reset (by the client, or because its connection is gone)."""


class H2Stream:
    """One request/response exchange on an HTTP/2 connection (see the module docstring)."""

    __slots__ = (
        "_reading_paused",
        "_unacked",
        "_window",
        "connection",
        "ended",
        "id",
        "reader",
        "request",
        "reset",
        "task",
    )

    max_field_size = MAX_FIELD_SIZE
    max_headers = MAX_HEADERS

    def __init__(self, connection: StreamConnection, stream_id: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.reader: StreamReader | None = None  # None: no body (END_STREAM came with the head)
        self.request: Any = None
        self.task: asyncio.Task[None] | None = None
        self.reset = False  # no frame may be sent on it any more
        self.ended = False  # END_STREAM sent: the answer is complete
        self._reading_paused = False
        self._unacked = 0  # body bytes buffered while reading is paused, not yet handed back
        self._window: asyncio.Future[None] | None = None

    # --- the request's "protocol" (what aiohttp's request and StreamReader read) ---------------

    @property
    def transport(self) -> H2Stream:
        return self

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.connection.ssl_context

    @property
    def peername(self) -> Any:
        return self.connection.peername

    @property
    def sockname(self) -> Any:
        return self.connection.sockname

    @property
    def gateway_connection(self) -> Connection:
        return self.connection.info

    @property
    def connected(self) -> bool:
        return not self.reset

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self, resume_parser: bool = True) -> None:
        if self._reading_paused:
            self._reading_paused = False
            unacked, self._unacked = self._unacked, 0
            if unacked:
                self.connection.acknowledge(self.id, unacked)

    def feed(self, data: bytes, flow_controlled: int) -> None:
        """Body bytes arrived: buffer them; hand the window back unless the buffer is full."""
        reader = self.reader
        if reader is None or self.reset:
            self.connection.acknowledge(self.id, flow_controlled)
            return
        reader.feed_data(data)
        if self._reading_paused:
            self._unacked += flow_controlled
        elif flow_controlled:
            self.connection.acknowledge(self.id, flow_controlled)

    def feed_eof(self) -> None:
        if self.reader is not None:
            self.reader.feed_eof()

    # --- the request's "transport" ----------------------------------------------------------------

    def close(self) -> None:
        """Cut the answer short: reset this stream (the connection and its other streams go on)."""
        if not self.reset and not self.ended:
            self.connection.reset_stream(self, ErrorCodes.INTERNAL_ERROR)

    abort = close

    def is_closing(self) -> bool:
        return self.reset or self.ended

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        transport = self.connection.transport
        return transport.get_extra_info(name, default) if transport is not None else default

    # --- the connection's side ----------------------------------------------------------------------

    def was_reset(self) -> None:
        """The stream is gone (reset by either side, or its connection closed): stop its handler."""
        if self.reset:
            return
        self.reset = True
        if self.reader is not None:
            self.reader.set_exception(StreamReset(f"stream {self.id} reset"))
        self.window_changed(StreamReset(f"stream {self.id} reset"))
        if self.task is not None:
            self.task.cancel()

    def window_changed(self, error: BaseException | None = None) -> None:
        """The client opened its window (or the stream is gone): a waiting writer may go on."""
        waiter = self._window
        if waiter is not None and not waiter.done():
            self._window = None
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    # --- sending -----------------------------------------------------------------------------------

    def send_head(self, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        if self.reset:
            raise StreamReset(f"stream {self.id} reset")
        connection = self.connection
        connection.h2.send_headers(self.id, fields, end_stream=end)
        if end:
            self.ended = True
        connection.flush()

    async def send_data(self, data: bytes, end: bool) -> None:
        """DATA frames within the stream's and the connection's windows and the client's frame
        size; waits for window, then for the transport to drain."""
        connection = self.connection
        h2 = connection.h2
        sid = self.id
        while True:
            if self.reset:
                raise StreamReset(f"stream {sid} reset")
            try:
                window = h2.local_flow_control_window(sid)
            except StreamClosedError:
                raise StreamReset(f"stream {sid} closed") from None
            size = len(data)
            frame = h2.max_outbound_frame_size
            if size <= window and size <= frame:
                h2.send_data(sid, data, end_stream=end)
                break
            if window <= 0:
                await self._wait_for_window()
                continue
            cut = min(window, frame)
            h2.send_data(sid, data[:cut])
            data = data[cut:]
            connection.flush()
        if end:
            self.ended = True
        connection.flush()
        if connection.writing_paused:
            await connection.drain()

    async def _wait_for_window(self) -> None:
        self.connection.flush()
        waiter = self._window
        if waiter is None:
            waiter = self._window = asyncio.get_running_loop().create_future()
            self.connection.waiting_for_window.add(self)
        try:
            await waiter
        finally:
            self.connection.waiting_for_window.discard(self)


class ResponseWriter(AbstractStreamWriter):
    """The payload writer aiohttp's response writes its head and body to (see the module docstring)."""

    def __init__(self, stream: H2Stream) -> None:
        self.stream = stream
        self._head: list[tuple[bytes, bytes]] | None = None
        self.length: int | None = None

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        # "HTTP/2.0 200 OK": the status is what follows the version.
        fields, close = response_fields(status_line[9:12], headers.items())
        if close:
            self.stream.connection.shut_down("connection_close")
        self._head = fields

    def send_headers(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self.stream.send_head(head, end=False)

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self.stream.send_head(head, end=False)
        if chunk:
            self.output_size += len(chunk)
            await self.stream.send_data(bytes(chunk), end=False)

    async def write_eof(self, chunk: bytes = b"") -> None:
        stream = self.stream
        head = self._head
        if head is not None:
            self._head = None
            if not chunk:
                stream.send_head(head, end=True)
                return
            stream.send_head(head, end=False)
        if stream.ended:
            return
        self.output_size += len(chunk)
        await stream.send_data(chunk, end=True)

    async def drain(self) -> None:
        connection = self.stream.connection
        if connection.writing_paused:
            await connection.drain()

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        # The gateway compresses nothing on the fly (pre-rendered documents carry their gzip).
        raise RuntimeError("on-the-fly compression is not supported on HTTP/2 streams")

    def enable_chunking(self) -> None:
        """HTTP/2 frames the body itself: nothing to do."""
