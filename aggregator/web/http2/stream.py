"""One HTTP/2 stream as the pipeline sees it: a `ServerRequest` (`web/serverrequest.py`).

- The request: the head libnghttp2 decoded (`heads.RequestHead`), the connection's identity, and
  the body (`H2Body`): bytes are buffered as DATA arrives and window goes back to the client only
  as the handler reads them (`nghttp2_session_consume`), so a client can never have more in flight
  than the stream's window.
- The answer: `respond` submits a whole response (HEADERS, and DATA when it has a body, with
  END_STREAM); `stream` starts one whose body the handler writes (`H2Answer`). Body bytes wait in
  the stream's queue until libnghttp2 asks for them (`read_body`, within the client's flow-control
  windows and frame size); a writer whose queue is full waits, so a slow reader holds its writer
  (a watch's relay, and through it the backend connection) instead of filling memory. An answer
  that cannot leave (the client never opens its window) keeps its writer waiting, inside the
  request's deadline (`web/timeout.py`), which then resets the stream: written at once, the
  stream knows whether its end left; written at the end of the loop's turn, it asks libnghttp2
  for the client's window instead.

A stream the client resets cancels its handler; a handler that ends before its answer did resets
the stream (`connection.py`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.web.connection import Connection
from aggregator.web.http2 import nghttp2
from aggregator.web.http2.codes import ErrorCode
from aggregator.web.serverrequest import EncodedHeaders, HeadHook, Response, StreamedResponse, Tunnel

# Queued answer bytes above which a writer waits for the client to take some.
HIGH_WATER = 256 * 1024
# Methods and statuses whose answers never carry a body.
_NO_BODY_STATUS = frozenset({204, 304})


class StreamReset(ConnectionResetError):
    """The stream was reset (by the client, or because its connection is gone)."""


class StreamOwner(Protocol):
    """What a stream asks of its connection (`connection.H2ServerConnection`)."""

    info: Connection
    writing_paused: bool

    def consume(self, stream: H2Stream, size: int) -> None: ...

    def submit_response(
        self, stream: H2Stream, status: int, headers: CIMultiDict[str], length: int | None, *, body: bool
    ) -> None: ...

    def resume(self, stream: H2Stream) -> None: ...

    def fits_window(self, stream: H2Stream, size: int) -> bool: ...

    def reset_stream(self, stream: H2Stream, code: ErrorCode) -> None: ...

    def shut_down(self, reason: str = ...) -> None: ...

    def flush(self) -> None: ...

    def write_answer(self) -> bool: ...

    async def drain(self) -> None: ...


class H2Body:
    """A request body as DATA frames bring it (`serverrequest.RequestBody`)."""

    __slots__ = ("_chunks", "_eof", "_error", "_waiter", "stream")

    def __init__(self, stream: H2Stream) -> None:
        self.stream = stream
        self._chunks: deque[bytes] = deque()
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    async def readany(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self.stream.consumed(len(chunk))
        return chunk

    async def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            chunk = await self.readany()
            if not chunk:
                break
            if 0 <= n < len(out) + len(chunk):
                keep = n - len(out)
                out += chunk[:keep]
                self._chunks.appendleft(chunk[keep:])  # its window went back with the whole chunk
                break
            out += chunk
        return bytes(out)


class H2Answer:
    """An answer being written on a stream (`serverrequest.StreamedResponse`)."""

    __slots__ = ("body_length", "headers", "status", "stream")

    def __init__(self, stream: H2Stream, status: int, headers: CIMultiDict[str]) -> None:
        self.stream = stream
        self.status = status
        self.headers = headers
        self.body_length = 0

    async def write(self, chunk: bytes) -> None:
        if chunk:
            self.body_length += len(chunk)
            await self.stream.send(chunk, end=False)

    async def finish(self, chunk: bytes = b"") -> None:
        self.body_length += len(chunk)
        await self.stream.send(chunk, end=True)

    def abort(self) -> None:
        self.stream.abort()

    @property
    def chunked(self) -> bool:
        return True  # END_STREAM marks the end of every HTTP/2 answer


class H2Stream:
    """One request/response exchange on an HTTP/2 connection (see the module docstring)."""

    __slots__ = (
        "_drained",
        "_out",
        "_queued",
        "_sent_out",
        "body",
        "closed",
        "connection",
        "deferred",
        "ended",
        "field_bytes",
        "fields",
        "handled",
        "head_only",
        "headers",
        "id",
        "method",
        "on_head",
        "owner",
        "raw_path",
        "raw_query",
        "remote_ended",
        "reset",
        "started",
        "streamed",
        "submitted",
        "target",
        "task",
        "too_large",
    )

    def __init__(self, owner: StreamOwner, stream_id: int) -> None:
        self.owner = owner
        self.id = stream_id
        self.connection: Connection = owner.info
        # The header list as decoded, until the head is complete.
        self.fields: list[tuple[bytes, bytes]] = []
        self.field_bytes = 0
        self.too_large = False
        # The head (`start`).
        self.method = ""
        self.target = ""
        self.raw_path = ""
        self.raw_query = ""
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.body: H2Body | None = None
        self.on_head: HeadHook | None = None
        self.streamed: StreamedResponse | None = None
        self.head_only = False
        self.task: asyncio.Task[None] | None = None
        self.started = False  # the handler's coroutine began (a task may be cancelled from then on)
        self.handled = False  # the handler returned
        self.remote_ended = False  # the client's END_STREAM arrived
        self.reset = False  # no frame may be sent on it any more
        self.closed = False  # libnghttp2 closed it
        self.submitted = False  # the answer's HEADERS went to libnghttp2
        self.ended = False  # the answer's last byte is queued (END_STREAM follows it)
        self.deferred = False  # libnghttp2 waits for more body (`nghttp2_session_resume_data`)
        self._out: deque[bytes | memoryview] = deque()
        self._queued = 0
        self._sent_out = False  # every byte queued went to libnghttp2, END_STREAM included
        self._drained: asyncio.Future[None] | None = None

    # --- the request -------------------------------------------------------------------------------

    def consumed(self, size: int) -> None:
        """The handler read `size` body bytes: window back to the client."""
        if size > 0:
            self.owner.consume(self, size)

    def tunnel(self) -> Tunnel | None:
        return None  # RFC 9113 has no Upgrade

    def add_encoded_headers(self, headers: CIMultiDict[str], encoded: EncodedHeaders) -> None:
        headers.extend(encoded.pairs)  # HPACK encodes them with the rest

    def close_connection(self, reason: str = "connection_close") -> None:
        self.owner.shut_down(reason)

    def abort(self) -> None:
        """Cut the answer short: reset this stream (the connection and its other streams go on)."""
        if not self.reset and not self._sent_out:
            self.owner.reset_stream(self, ErrorCode.INTERNAL_ERROR)

    # --- answering ----------------------------------------------------------------------------------

    async def respond(self, response: Response) -> None:
        status = response.status
        headers = response.headers
        body = response.body
        if self.on_head is not None:
            self.on_head(status, headers)
        if response.close:
            self.owner.shut_down("connection_close")
        if self.head_only or status in _NO_BODY_STATUS or status < 200:
            self._submit(status, headers, len(body) if status >= 200 else None, end=True)
            self.owner.write_answer()
            return
        if body:
            self._out.append(body)
            self._queued = len(body)
        self.ended = True
        self._submit(status, headers, len(body), end=not body)
        if self.owner.write_answer():
            if not self._sent_out:  # the client's window is closed: wait (within the deadline)
                await self._until_queued(0)
        elif body and not self.owner.fits_window(self, len(body)):
            await self._until_queued(0)

    async def stream(
        self, status: int, headers: CIMultiDict[str], *, reason: str = "", head_now: bool = True
    ) -> StreamedResponse:
        answer = H2Answer(self, status, headers)
        self.streamed = answer
        if self.on_head is not None:
            self.on_head(status, headers)
        if head_now:
            self._submit(status, headers, None, end=self.head_only)
            self.owner.write_answer()
        else:
            answer.headers = headers  # submitted with the first body bytes
        return answer

    def _submit(self, status: int, headers: CIMultiDict[str], length: int | None, *, end: bool) -> None:
        if self.reset:
            raise StreamReset(f"stream {self.id} reset")
        self.submitted = True
        if end:
            self.ended = True
            self._sent_out = True
        self.owner.submit_response(self, status, headers, length, body=not end)

    async def send(self, chunk: bytes, *, end: bool) -> None:
        """Queue body bytes (and the end), then wait while more than `HIGH_WATER` is queued."""
        if self.reset:
            raise StreamReset(f"stream {self.id} reset")
        if self.ended:
            return
        if not self.submitted:
            answer = self.streamed
            assert answer is not None, "stream() before send()"
            if self.head_only:
                self._submit(answer.status, answer.headers, None, end=True)
                self.owner.write_answer()
                return
            self._submit(answer.status, answer.headers, None, end=False)
        if chunk:
            self._out.append(chunk)
            self._queued += len(chunk)
        if end:
            self.ended = True
        if self.deferred:
            self.deferred = False
            self.owner.resume(self)
        if self.owner.write_answer():
            if end and not self._sent_out:  # the client's window is closed: wait (within the deadline)
                await self._until_queued(0)
                return
        elif end and self._queued and not self.owner.fits_window(self, self._queued):
            await self._until_queued(0)
            return
        if self._queued > HIGH_WATER:
            await self._until_queued(HIGH_WATER)
        elif self.owner.writing_paused:
            await self.owner.drain()

    async def _until_queued(self, limit: int) -> None:
        """Wait until at most `limit` body bytes are still queued; for 0, until the end of the
        answer went to libnghttp2 too. Raises StreamReset if the stream goes first."""
        while not self.reset and (self._queued > limit or (limit == 0 and not self._sent_out)):
            waiter = self._drained = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._drained = None
        if self.reset:
            raise StreamReset(f"stream {self.id} reset")

    def read_body(self, buf: Any, length: int, flags: Any, memmove: Any) -> int:
        """libnghttp2 asks for up to `length` body bytes: copied into `buf`; NGHTTP2_ERR_DEFERRED
        when none is queued yet (it waits for `resume`)."""
        out = self._out
        written = 0
        if out:
            # The first chunk at `buf` itself (pointer arithmetic makes a cdata object): a small
            # answer's whole body is this one call.
            chunk = out[0]
            size = len(chunk)
            if size <= length:
                memmove(buf, chunk, size)
                out.popleft()
                written = size
        while out and written < length:
            chunk = out[0]
            size = len(chunk)
            take = length - written
            if size <= take:
                memmove(buf + written, chunk, size)
                written += size
                out.popleft()
            else:
                view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
                memmove(buf + written, view[:take], take)
                out[0] = view[take:]
                written += take
        self._queued -= written
        if not out and self.ended:
            flags[0] = 1  # NGHTTP2_DATA_FLAG_EOF
            self._sent_out = True
        elif not written:
            self.deferred = True
            return nghttp2.ERR_DEFERRED
        waiter = self._drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return written

    # --- the connection's side -------------------------------------------------------------------------

    def was_reset(self) -> None:
        """The stream is gone (reset by either side, or its connection closed): stop its handler."""
        if self.reset:
            return
        self.reset = True
        if self.body is not None:
            self.body.fail(StreamReset(f"stream {self.id} reset"))
        waiter = self._drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.task is not None and self.started and not self.handled:
            self.task.cancel()


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
