"""One HTTP/2 server connection: a libnghttp2 session between the TLS transport and the pipeline.

Frames in: every read is first shown to the frame guard (`guard.py`), then to libnghttp2
(`nghttp2_session_mem_recv`), whose callbacks drive the streams: a complete request head starts
a handler (or queues it), DATA feeds its body, a reset cancels it. A callback never raises: what
must end the connection is recorded and acted on once libnghttp2 returns. Frames out
(`nghttp2_session_mem_send`): an answer given while no other handler runs is written at once, in
its handler's step (one request at a time: no loop turn between the answer and its write);
otherwise, and for what the session owes on its own (acknowledgements, window updates, resets),
once per turn of the event loop, so the answers of streams served together leave in one TLS write.

Handlers are bounded as Go's server bounds them (golang.org/x/net/http2 server.go
`scheduleHandler`, the fix of CVE-2023-44487): at most `max_streams` run at once, counting the
handlers of streams already reset until they have returned; more wait in a queue, and a queue over
4x the stream limit ends the connection with GOAWAY ENHANCE_YOUR_CALM ("rapid_reset"). Beyond Go,
streams the client resets before their handler started spend a budget of their own (32 at
once): a flood is cut some thirty streams in, not five hundred, and a read that holds the whole
flood is examined only up to the slice that cut it (`RECEIVE_SLICE`). Stream
resets, the client's and those its protocol errors cause (MadeYouReset), also spend a token
bucket; an empty bucket is GOAWAY ENHANCE_YOUR_CALM too ("reset_flood"). Decoded header lists are
bounded per stream (`max_header_list_size`: past it the request is answered 431, as Go's server
answers a truncated header list) and per connection (`max_header_bytes_held`: the lists of the
streams alive at once; past it, 431 too), so one connection cannot pin more than a few MiB of
headers however its HPACK references multiply them (RFC 7541 7.3, RFC 9113 10.5.1).

Graceful end (shutdown, idle timeout, `Connection: close`, an unauthenticated caller, the
client's own GOAWAY): a GOAWAY with NO_ERROR and the last stream id processed; streams up to it
are served to the end (a watch ends as on HTTP/1.1, when the shutdown ends it), later ones are not
processed, and the connection closes once the last handler returns. Error end: GOAWAY with the
error code, every handler cancelled, input read and dropped for a second (so the client reads the
GOAWAY, not a TCP reset), then close.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, cast

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.util.logs import fields
from aggregator.web.connection import HTTP2, Connection
from aggregator.web.http2 import nghttp2
from aggregator.web.http2.codes import ErrorCode
from aggregator.web.http2.guard import FrameGuard, TokenBucket, Violation
from aggregator.web.http2.heads import BadRequest
from aggregator.web.http2.serving import Http2Serving
from aggregator.web.http2.stream import H2Body, H2Stream, StreamReset
from aggregator.web.serverrequest import Response

log = logging.getLogger(__name__)

# Reads larger than this are examined (guard, then libnghttp2) a slice at a time, so a read that
# holds a whole flood stops where the flood was cut: the guard's cost is per frame (a flood's are
# 20-40 bytes each; a 4 KiB slice holds about a hundred streams), and a body's few large DATA
# frames pay one more call per slice.
RECEIVE_SLICE = 4 * 1024
# What the answer to a request whose header list is too large says (Go's `handleHeaderListTooLong`).
HEADER_LIST_TOO_LONG = b"<h1>HTTP Error 431</h1><p>Request Header Field(s) Too Large</p>"


class H2ServerConnection(asyncio.Protocol):
    """One client connection that negotiated `h2` (see the module docstring)."""

    def __init__(self, serving: Http2Serving) -> None:
        self.serving = serving
        self.limits = limits = serving.limits
        self.lib = serving.nghttp2
        self.loop = asyncio.get_running_loop()
        session = self.lib.new_session(limits, self)
        # The session's callbacks are this connection's bound methods: a reference cycle, broken
        # when the connection is lost (so the connection is freed as its last reference goes, not
        # left to the cyclic collector, which `gc.freeze` may have put out of reach).
        self._session: nghttp2.Session | None = session
        self.session = session.handle
        self._data_provider = session.data_provider
        # The compiled header collector (`nghttp2.HeaderBlocks`), or None: `on_header` collects.
        self._blocks = session.blocks
        self._unpack = self.lib.unpack
        self._memmove = self.lib.memmove
        self.guard = FrameGuard(limits)
        self.resets = TokenBucket(limits.reset_burst, limits.reset_rate)
        self._unstarted_resets = TokenBucket(limits.unstarted_reset_burst, limits.reset_rate)
        self.transport: asyncio.Transport | None = None
        self.info = Connection(None, None)
        self.streams: dict[int, H2Stream] = {}
        self.queued: deque[H2Stream] = deque()
        self.running = 0  # handlers started and not yet returned
        self.header_bytes = 0  # decoded header bytes held by streams alive
        self.max_header_list_size = limits.max_header_list_size
        self.max_header_bytes_held = limits.max_header_bytes_held
        self.writing_paused = False
        self._flush_scheduled = False
        self._drain: asyncio.Future[None] | None = None
        self.goaway_sent = False  # graceful GOAWAY submitted: no new streams
        self.last_stream_id = 0  # the last stream that GOAWAY said is served
        self._close_scheduled = False
        self._goaway_out = False  # a GOAWAY frame went out (the library's own, after a protocol error, too)
        self.closing = False  # error GOAWAY submitted (or the connection is gone): nothing is served
        self._settled = False  # the client's first SETTINGS arrived
        self._violation: Violation | None = None  # what a callback found: acted on after mem_recv
        self._our_resets: set[int] = set()  # streams the gateway reset itself
        self._client_resets: set[int] = set()  # streams the client reset
        self._last_request = 0  # the highest stream whose request head arrived
        # The header block being decoded (`on_header`): its stream, fields, size, and the size
        # past which a header takes the slow path (`_header_checked`); -1 until a block starts.
        self._block_stream = 0
        self._block: list[tuple[bytes, bytes]] = []
        self._block_bytes = 0
        self._block_limit = -1
        self._block_too_large = False
        self._idle_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no subclass of asyncio.Transport, but it is one.
        self.transport = cast(asyncio.Transport, transport)
        self.info = Connection.of_transport(transport, protocol=HTTP2)
        limits = self.limits
        lib, ffi = self.lib.lib, self.lib.ffi
        settings = ffi.new(
            "nghttp2_settings_entry[4]",
            [
                (nghttp2.SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_streams),
                (nghttp2.SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (nghttp2.SETTINGS_MAX_FRAME_SIZE, limits.max_frame_size),
                (nghttp2.SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
            ],
        )
        lib.nghttp2_submit_settings(self.session, 0, settings, 4)
        lib.nghttp2_session_set_local_window_size(self.session, 0, 0, limits.connection_window)
        self.flush()
        self.serving.opened(self)
        self._idle_since = self.loop.time()
        self._timer = self.loop.call_later(limits.preface_timeout, self._on_timer)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # after an error GOAWAY: read and drop until the close
        if len(data) <= RECEIVE_SLICE:
            self._receive(data)
        else:
            # A large read (a body, or a flood sent in one write) goes to the guard and the
            # library a slice at a time: a flood is cut in the slice that spends its budget, and
            # the rest of the read is dropped unexamined instead of being inspected first.
            for start in range(0, len(data), RECEIVE_SLICE):
                self._receive(data[start : start + RECEIVE_SLICE])
                if self.closing:
                    return
        if self.queued:
            self._dispatch()

    def _receive(self, data: bytes) -> None:
        try:
            self.guard.inspect(data)
        except Violation as violation:
            self._fail(violation)
            return
        binding = self.lib
        result = binding.lib.nghttp2_session_mem_recv(self.session, data, len(data))
        if self._violation is not None:
            self._fail(self._violation)
            return
        if result < 0:
            # libnghttp2 ended the session for the client's protocol error: its GOAWAY is queued.
            self._fail(Violation("protocol_error", ErrorCode.PROTOCOL_ERROR, binding.error(result)), submit=False)
        elif binding.lib.nghttp2_session_want_write(self.session):
            self.flush()  # SETTINGS and PING acknowledgements, window updates

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost ends every stream

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for stream in [*self.streams.values(), *self.queued]:
            stream.was_reset()
        self.queued.clear()
        waiter = self._drain
        if waiter is not None and not waiter.done():
            waiter.set_exception(StreamReset("connection closed"))
            waiter.exception()  # retrieved: nobody else may be waiting
        self._drain = None
        self.transport = None
        self.serving.closed(self)
        # The callbacks go (the cycle through them with it); the session stays until this
        # connection is freed, for the handlers still finishing. Nothing drives it any more:
        # libnghttp2 calls back only from `mem_recv` (a read) and `mem_send` (`write_out`, which
        # returns at once without a transport).
        self._session = None

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.guard.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.guard.resumed()
        waiter = self._drain
        if waiter is not None:
            self._drain = None
            if not waiter.done():
                waiter.set_result(None)
        self.flush()

    # --- writing ----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the session has to send once this turn of the event loop is over: the frames
        of every stream answered in one turn leave in one TLS write (one encryption, one system
        call) instead of one per frame."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.write_out)

    def write_out(self) -> None:
        """Write what the session has to send now (nothing while the client is not reading)."""
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing() or (self.writing_paused and not self.closing):
            return  # resume_writing flushes; meanwhile what is owed waits in the session
        binding = self.lib
        lib, out, unpack = binding.lib, binding.out, binding.unpack
        mem_send = lib.nghttp2_session_mem_send
        session = self.session
        size = mem_send(session, out)
        if size > 0:
            # Each chunk is one whole frame (`nghttp2_session_mem_send` hands out one frame
            # buffer a call): byte 3 is its type. What one turn owes is joined into one write.
            chunk = unpack(out[0], size)
            goaway = chunk[3] == nghttp2.GOAWAY
            size = mem_send(session, out)
            if size > 0:
                chunks = [chunk]
                while size > 0:
                    chunk = unpack(out[0], size)
                    goaway = goaway or chunk[3] == nghttp2.GOAWAY
                    chunks.append(chunk)
                    size = mem_send(session, out)
                chunk = b"".join(chunks)
            if goaway:
                self._goaway_out = True
            transport.write(chunk)
        if self._violation is not None:  # a callback during mem_send (a reset flood's last reset)
            self._fail(self._violation)
            return
        if not (self._goaway_out or self.goaway_sent or self.closing):
            # A session ends only after a GOAWAY went out or came in (`nghttp2_session_want_read`);
            # until then asking costs a call into the library per write for nothing.
            return
        if lib.nghttp2_session_want_read(session) or lib.nghttp2_session_want_write(session):
            return
        if not self.goaway_sent and not self.closing:
            # libnghttp2 ended the session for the client's protocol error, its GOAWAY just sent.
            self._fail(Violation("protocol_error", ErrorCode.PROTOCOL_ERROR, "the session ended"), submit=False)
            return
        self._close_soon()

    async def drain(self) -> None:
        """Wait until the transport takes more (the client reads again)."""
        if not self.writing_paused:
            return
        if self.transport is None:
            raise StreamReset("connection closed")
        waiter = self._drain
        if waiter is None:
            waiter = self._drain = self.loop.create_future()
        await asyncio.shield(waiter)

    # --- what streams ask of their connection ------------------------------------------------------

    def submit_response(
        self, stream: H2Stream, status: int, headers: CIMultiDict[str], length: int | None, *, body: bool
    ) -> None:
        array, count, data, close = self.serving.heads.pack(status, headers, length)
        if close:
            self.shut_down("connection_close")
        binding = self.lib
        provider = self._data_provider if body else binding.ffi.NULL
        code = binding.lib.nghttp2_submit_response(self.session, stream.id, array, count, provider)
        del data
        if code != 0:
            stream.was_reset()
            raise StreamReset(f"stream {stream.id}: {binding.error(code)}")

    def write_answer(self) -> bool:
        """A stream queued answer frames: written at once when no other handler runs (one request
        at a time: no loop turn between the answer and its write, and the stream knows at once
        whether its body left, without asking for the client's window), else once this turn of
        the loop is over, so the answers of streams served together leave in one TLS write.
        True when written now."""
        if self.running > 1:
            self.flush()
            return False
        self.write_out()
        return True

    def resume(self, stream: H2Stream) -> None:
        self.lib.lib.nghttp2_session_resume_data(self.session, stream.id)

    def fits_window(self, stream: H2Stream, size: int) -> bool:
        """Whether `size` more bytes can go to the client now (its stream window, which libnghttp2
        caps by the connection's)."""
        window: int = self.lib.lib.nghttp2_session_get_stream_remote_window_size(self.session, stream.id)
        return window >= size

    def consume(self, stream: H2Stream, size: int) -> None:
        """Body bytes were read: hand their window back to the client."""
        if self.closing:
            return
        self.lib.lib.nghttp2_session_consume(self.session, stream.id, size)
        self.flush()

    def reset_stream(self, stream: H2Stream, code: ErrorCode) -> None:
        """Reset one stream from the gateway's side (a cut answer, a refused head)."""
        if self.closing or stream.reset:
            return
        self._our_resets.add(stream.id)
        self.lib.lib.nghttp2_submit_rst_stream(self.session, 0, stream.id, code)
        stream.was_reset()
        self.flush()

    def shut_down(self, reason: str = "shutdown") -> None:
        """Graceful GOAWAY: serve the streams received so far, refuse later ones, close when done."""
        if self.goaway_sent or self.closing or self.transport is None:
            return
        self.goaway_sent = True
        lib = self.lib.lib
        last = self.last_stream_id = lib.nghttp2_session_get_last_proc_stream_id(self.session)
        lib.nghttp2_submit_goaway(self.session, 0, last, ErrorCode.NO_ERROR, self.lib.ffi.NULL, 0)
        self.serving.metrics.goaway(reason)
        for stream in list(self.queued):
            if stream.id > last:  # never reached a handler: refused, as the GOAWAY says
                self.queued.remove(stream)
                self.streams.pop(stream.id, None)
        self.flush()

    def close(self) -> None:
        """The server is closing: cut whatever is left."""
        self.closing = True
        for stream in [*self.streams.values(), *self.queued]:
            stream.was_reset()
        self.queued.clear()
        if self.transport is not None:
            self.write_out()
            self.transport.close()

    # --- session callbacks (`nghttp2.SessionEvents`) -----------------------------------------------

    def on_header(
        self, session: Any, hd: Any, name: Any, namelen: int, value: Any, valuelen: int, flags: int, user_data: Any
    ) -> int:
        # The Python collector, where the compiled one (`nghttp2.HeaderBlocks`, the same limits) is
        # not installed or AGGREGATOR_HTTP2_COMPILED=0 turned it off; libnghttp2 calls it then.
        # Every header of every request passes here: the fast path is a sum, a comparison and an
        # append to the block being decoded. The limits are one number (`_block_limit`: what the
        # stream's header list and the connection's may still take), so a header list is bounded
        # as it is decoded, not once it is complete (RFC 7541 7.3: one-byte references to a large
        # table entry). A block's first header takes the slow path (the limit is -1 between
        # blocks), which records the block's stream; the HEADERS frame that completes it must
        # name the same stream, or its fields are not the request's.
        size = self._block_bytes + namelen + valuelen + 32  # RFC 9113 6.5.2's accounting
        if size > self._block_limit:
            return self._header_checked(hd.stream_id, name, namelen, value, valuelen)
        self._block_bytes = size
        unpack = self._unpack
        self._block.append((unpack(name, namelen), unpack(value, valuelen)))
        return 0

    def _header_checked(self, stream_id: int, name: Any, namelen: int, value: Any, valuelen: int) -> int:
        """A block's first header, or one past the size the fast path allows."""
        if stream_id != self._block_stream:
            # A new block. One left unfinished was refused by libnghttp2 midway (its stream is
            # reset, no HEADERS frame completes it; `on_invalid_frame` drops it first): its
            # fields go.
            self._drop_block()
            self._block_stream = stream_id
            self._block_limit = self._header_room()
        if self._block_too_large:
            return 0
        size = self._block_bytes + namelen + valuelen + 32
        if size > self._block_limit:
            self._block_limit = self._header_room()  # handlers may have returned since the block began
            if size > self._block_limit:
                # Answered 431 once complete (`_serve`); what is decoded later is dropped.
                self._block = []
                self._block_bytes = 0
                self._block_too_large = True
                self._block_limit = -1
                return 0
        self._block_bytes = size
        unpack = self._unpack
        self._block.append((unpack(name, namelen), unpack(value, valuelen)))
        return 0

    def _hold_header_bytes(self, change: int) -> None:
        """The decoded header lists live streams hold grew or shrank by `change` bytes."""
        self.header_bytes += change
        if self._blocks is not None:
            self._blocks.held(self.header_bytes)

    def _header_room(self) -> int:
        """What one header list may hold: the stream's limit, and what the connection's limit
        leaves of the lists its live streams hold."""
        return min(self.max_header_list_size, self.max_header_bytes_held - self.header_bytes)

    def _drop_block(self) -> None:
        self._block_stream = 0
        if self._block_bytes or self._block_too_large:
            self._block = []
            self._block_bytes = 0
            self._block_too_large = False
        self._block_limit = -1

    def on_frame_recv(self, session: Any, hd: Any, user_data: Any) -> int:
        kind = hd.type
        if kind == nghttp2.HEADERS:
            stream_id = hd.stream_id
            flags = hd.flags
            blocks = self._blocks
            if blocks is not None:
                request_fields, size, too_large = blocks.take(stream_id)
            else:
                if stream_id == self._block_stream:
                    request_fields, size, too_large = self._block, self._block_bytes, self._block_too_large
                else:  # a block without fields (trailers can be empty), or not this stream's
                    request_fields, size, too_large = [], 0, False
                self._block = []
                self._block_stream = self._block_bytes = 0
                self._block_limit = -1
                self._block_too_large = False
            if stream_id <= self._last_request:
                # Not a new stream (libnghttp2 takes new ones in increasing order only): trailers,
                # which nothing reads.
                stream = self.streams.get(stream_id)
                if stream is not None and flags & nghttp2.FLAG_END_STREAM:  # the end of the body
                    self._body_ended(stream)
                return 0
            self._last_request = stream_id
            stream = self.streams[stream_id] = H2Stream(self, stream_id)
            if too_large:
                stream.too_large = True
            else:
                stream.fields = request_fields
                stream.field_bytes = size
                self._hold_header_bytes(size)
            if flags & nghttp2.FLAG_END_STREAM:
                stream.remote_ended = True
            return self._on_request(stream)
        if kind == nghttp2.DATA:
            if hd.flags & nghttp2.FLAG_END_STREAM:
                stream = self.streams.get(hd.stream_id)
                if stream is not None:
                    self._body_ended(stream)
            return 0
        if kind == nghttp2.RST_STREAM:
            self._client_resets.add(hd.stream_id)
            return self._spend_reset()
        if kind == nghttp2.SETTINGS:
            if not hd.flags & nghttp2.FLAG_ACK:
                self._settled = True
            return 0
        if kind == nghttp2.GOAWAY:
            # The client is leaving: answer with a GOAWAY (as Go's server does), finish what it
            # sent, then close.
            self.shut_down("client_goaway")
        return 0

    def on_invalid_frame(self, session: Any, hd: Any, error: int, user_data: Any) -> int:
        if self._blocks is not None:
            self._blocks.drop(hd.stream_id)
        elif hd.stream_id == self._block_stream:
            self._drop_block()
        log.debug("HTTP/2 frame refused", extra=fields(remote=self.info.remote, reason=self.lib.error(error)))
        return 0

    def on_data(self, session: Any, flags: int, stream_id: int, data: Any, length: int, user_data: Any) -> int:
        stream = self.streams.get(stream_id)
        body = stream.body if stream is not None else None
        if body is None or stream is None or stream.reset:
            # Nobody will read it: hand the window back at once.
            self.lib.lib.nghttp2_session_consume(self.session, stream_id, length)
            return 0
        body.feed(self._unpack(data, length))
        return 0

    def on_stream_close(self, session: Any, stream_id: int, error_code: int, user_data: Any) -> int:
        if self._blocks is not None:
            self._blocks.drop(stream_id)
        elif stream_id == self._block_stream:
            self._drop_block()
        stream = self.streams.get(stream_id)
        ours = theirs = False
        if self._our_resets:
            ours = stream_id in self._our_resets
            self._our_resets.discard(stream_id)
        if self._client_resets:
            theirs = stream_id in self._client_resets
            self._client_resets.discard(stream_id)
        if error_code and not ours and not theirs:
            # libnghttp2 reset it for the client's protocol error (MadeYouReset): it counts too.
            failed = self._spend_reset()
            if failed:
                return failed
        if stream is None:
            return 0
        if theirs and stream.task is None and not self._unstarted_resets.take():
            # Reset before its handler ever started, beyond what any client does but a rapid-reset
            # flood: cut it here, some thirty streams in, not four hundred.
            limits = self.limits
            return self._violate(
                Violation(
                    "rapid_reset",
                    ErrorCode.ENHANCE_YOUR_CALM,
                    f"more than {limits.unstarted_reset_burst} streams reset before they were served",
                )
            )
        stream.closed = True
        if error_code or not stream.ended:
            stream.was_reset()
        if stream.task is None or stream.handled:
            self._forget(stream)
        return 0

    def read_body(
        self, session: Any, stream_id: int, buf: Any, length: int, flags: Any, source: Any, user_data: Any
    ) -> int:
        stream = self.streams.get(stream_id)
        if stream is None:
            return nghttp2.ERR_TEMPORAL_CALLBACK_FAILURE
        return stream.read_body(buf, length, flags, self._memmove)

    def on_error(self, session: Any, code: int, message: Any, length: int, user_data: Any) -> int:
        reason = self.lib.ffi.string(message, length).decode("utf-8", "replace")
        log.debug("HTTP/2 session error", extra=fields(remote=self.info.remote, reason=reason))
        return 0

    # --- requests -----------------------------------------------------------------------------------

    def _on_request(self, stream: H2Stream) -> int:
        self._idle_since = None
        if self.goaway_sent and stream.id > self.last_stream_id:
            self.reset_stream(stream, ErrorCode.REFUSED_STREAM)  # after the GOAWAY: not served
            self._forget(stream)
            return 0
        if not stream.remote_ended and not _no_body(stream.fields):
            stream.body = H2Body(stream)
        # Started once libnghttp2 has returned (`_dispatch`): a stream the same read resets
        # (a rapid-reset flood sends each HEADERS with its RST_STREAM) never gets a handler.
        self.queued.append(stream)
        if len(self.queued) > self.limits.max_queued_handlers:
            return self._violate(
                Violation(
                    "rapid_reset",
                    ErrorCode.ENHANCE_YOUR_CALM,
                    f"more than {self.limits.max_queued_handlers} streams waiting for a handler",
                )
            )
        return 0

    def _body_ended(self, stream: H2Stream) -> None:
        stream.remote_ended = True
        if stream.body is not None:
            stream.body.feed_eof()

    def _dispatch(self) -> None:
        """Start the queued handlers there is room for (Go's `scheduleHandler`)."""
        queued = self.queued
        while queued and self.running < self.limits.max_streams:
            waiting = queued.popleft()
            if waiting.reset:  # reset before it started: skipped, as Go's `handlerDone`
                self._forget(waiting)
            else:
                self._start(waiting)

    def _start(self, stream: H2Stream) -> None:
        self.running += 1
        stream.task = self.loop.create_task(self._serve(stream))

    async def _serve(self, stream: H2Stream) -> None:
        """The stream's handler; its end (`_handler_done`) is its own `finally`, not a done
        callback (one loop turn and one call fewer per request). A stream reset before this
        starts is not cancelled (a task cancelled before its first step never runs its body,
        `finally` included), it returns here at once."""
        stream.started = True
        # The decoded header list stays counted (`header_bytes`) until the handler returns.
        fields_ = stream.fields
        stream.fields = []
        try:
            if stream.reset:
                return
            if stream.too_large:
                await stream.respond(Response(431, HEADER_LIST_TOO_LONG, content_type="text/html; charset=utf-8"))
                return
            try:
                head = self.serving.names.request(fields_)
            except BadRequest as err:
                log.info("HTTP/2 request refused", extra=fields(remote=self.info.remote, reason=str(err)))
                self.reset_stream(stream, ErrorCode.PROTOCOL_ERROR)
                if not self.resets.take():
                    self._fail(
                        Violation("reset_flood", ErrorCode.ENHANCE_YOUR_CALM, "too many malformed requests")
                    )
                return
            stream.method = head.method
            stream.target = head.target
            stream.raw_path = head.raw_path
            stream.raw_query = head.raw_query
            stream.headers = CIMultiDictProxy(head.headers)
            stream.head_only = head.method == "HEAD"
            await self.serving.handler(stream)
        except (asyncio.CancelledError, ConnectionResetError):
            pass  # the stream was reset or the connection is gone: nobody to answer
        except Exception:
            log.exception("HTTP/2 stream failed", extra=fields(method=stream.method, path=stream.target))
        finally:
            self._handler_done(stream)

    def _handler_done(self, stream: H2Stream) -> None:
        stream.handled = True
        self.running -= 1
        if stream.field_bytes:
            self._hold_header_bytes(-stream.field_bytes)
            stream.field_bytes = 0
        if not self.closing and not stream.reset and not stream.closed:
            if not stream.ended:
                # Not answered to the end (the handler failed after its head went out).
                self.reset_stream(stream, ErrorCode.INTERNAL_ERROR)
            elif not stream.remote_ended:
                # Answered while the client still sends: the rest is not wanted (Go's server).
                # The answer's frames go out first: libnghttp2 sends a reset queued now ahead of
                # the answer's DATA, and the client would read a stream error, not the answer.
                self.write_out()
                self.reset_stream(stream, ErrorCode.NO_ERROR)
        if stream.closed or stream.reset:
            self._forget(stream)
        self._dispatch()
        if self.goaway_sent and not self.streams:
            self.flush()  # the session may be over: write_out closes the connection

    def _forget(self, stream: H2Stream) -> None:
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if stream.field_bytes:
            self._hold_header_bytes(-stream.field_bytes)
            stream.field_bytes = 0
        if not self.streams and not self.goaway_sent:
            self._idle_since = self.loop.time()

    # --- ending --------------------------------------------------------------------------------------

    def _spend_reset(self) -> int:
        if self.resets.take():
            return 0
        limits = self.limits
        return self._violate(
            Violation(
                "reset_flood",
                ErrorCode.ENHANCE_YOUR_CALM,
                f"stream resets beyond {limits.reset_burst} at once or {limits.reset_rate:g}/s",
            )
        )

    def _violate(self, violation: Violation) -> int:
        """From a callback: end the session once libnghttp2 returns."""
        if self._violation is None:
            self._violation = violation
        return nghttp2.ERR_CALLBACK_FAILURE

    def _fail(self, violation: Violation, *, submit: bool = True) -> None:
        """End the connection now: GOAWAY with the violation's code, handlers cancelled."""
        self._violation = None
        if self.closing:
            return
        if violation.reason != "client_goaway":
            log.info(
                "HTTP/2 connection ended by a limit or a protocol error",
                extra=fields(remote=self.info.remote, reason=violation.reason, detail=str(violation)),
            )
        self.serving.metrics.goaway(violation.reason)
        if violation.code == ErrorCode.ENHANCE_YOUR_CALM:  # a flood: its address waits (penalty.py)
            self.serving.penalties.penalise(self.info.remote)
        if submit:
            self.lib.lib.nghttp2_session_terminate_session(self.session, violation.code)
        self.closing = True
        for stream in [*self.streams.values(), *self.queued]:
            stream.was_reset()
        self.queued.clear()
        transport = self.transport
        if transport is None:
            return
        self.write_out()
        if violation.reason == "control_queue":
            transport.abort()  # the client reads nothing: the GOAWAY would never reach it
            return
        self._close_soon()

    def _close_soon(self) -> None:
        """Close after `goaway_timeout`, reading and dropping meanwhile (once)."""
        transport = self.transport
        self.closing = True
        if transport is None or self._close_scheduled:
            return
        self._close_scheduled = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.limits.goaway_timeout, transport.close)

    def _on_timer(self) -> None:
        """The preface deadline, then the idle timeout (one timer, re-armed)."""
        self._timer = None
        transport = self.transport
        if transport is None or self.closing:
            return
        if not self._settled:
            log.info("HTTP/2 client sent no preface in time", extra=fields(remote=self.info.remote))
            transport.close()
            return
        idle = self.limits.idle_timeout
        since = self._idle_since
        now = self.loop.time()
        if since is not None and now - since >= idle:
            self.shut_down("idle")
            return
        wait = idle if since is None else idle - (now - since)
        self._timer = self.loop.call_later(wait, self._on_timer)


def _no_body(request_fields: list[tuple[bytes, bytes]]) -> bool:
    """`content-length: 0`: the request has no body (whatever END_STREAM says)."""
    return any(name == b"content-length" and value == b"0" for name, value in request_fields)


__all__ = ["H2ServerConnection", "StreamReset"]
