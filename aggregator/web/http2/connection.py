"""One HTTP/2 server connection: the h2 library's state machine between the TLS transport and
the request pipeline.

Frames in: every read is first shown to the frame guard (`guard.py`), then to h2, whose events
drive the streams: a request head starts a handler (or queues it), DATA feeds its body, a reset
cancels it, a window update wakes its writer. Frames out: whatever h2 has to send is written to
the transport after each read and after each write a stream makes.

Handlers are bounded as Go's server bounds them (golang.org/x/net/http2 server.go
`scheduleHandler`, the fix of CVE-2023-44487): at most `max_streams` run at once, counting the
handlers of streams already reset until they have returned; more wait in a queue, and a queue over
4x the stream limit ends the connection with GOAWAY ENHANCE_YOUR_CALM ("rapid_reset"). Stream
resets, the client's and those its protocol errors cause (MadeYouReset), also spend a token
bucket; an empty bucket is GOAWAY ENHANCE_YOUR_CALM too ("reset_flood").

Graceful end (shutdown, idle timeout, `Connection: close`, an unauthenticated caller): a GOAWAY
with NO_ERROR and the last stream id received; streams up to it are served to the end (a watch
ends as on HTTP/1.1, when the shutdown ends it), later ones are refused (REFUSED_STREAM, which
clients retry on a new connection), and the connection closes once the last handler returns. The
h2 library treats any GOAWAY it sends as the connection's end, so the graceful one is written
beside it. Error end: h2's GOAWAY with the error code, every handler cancelled, input read and
dropped for a second (so the client reads the GOAWAY, not a TCP reset), then close.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from h2 import events
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import DenialOfServiceError, ProtocolError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from aggregator.util._aiohttp import EMPTY_PAYLOAD, StreamReader, stream_request
from aggregator.util.logs import fields
from aggregator.web.context import HTTP2, Connection
from aggregator.web.http2.guard import FrameGuard, TokenBucket, Violation
from aggregator.web.http2.heads import BadRequest
from aggregator.web.http2.request import H2Request
from aggregator.web.http2.serving import Http2Serving
from aggregator.web.http2.stream import H2Stream, ResponseWriter, StreamReset

log = logging.getLogger(__name__)

# The connection window every HTTP/2 connection starts with (RFC 9113 6.9.2).
INITIAL_CONNECTION_WINDOW = 65535
# Bytes of a read handed to h2 at once (a TLS record's worth).
RECEIVE_SLICE = 16384


class H2ServerConnection(asyncio.Protocol):
    """One client connection that negotiated `h2` (see the module docstring)."""

    def __init__(self, serving: Http2Serving) -> None:
        self.serving = serving
        self.limits = limits = serving.limits
        self.loop = asyncio.get_running_loop()
        self.h2 = H2Connection(config=serving.config)
        self.guard = FrameGuard(limits)
        self.resets = TokenBucket(limits.reset_burst, limits.reset_rate)
        self.transport: asyncio.Transport | None = None
        self.info = Connection(None, None)
        self.ssl_context: ssl.SSLContext | None = None
        self.peername: Any = None
        self.sockname: Any = None
        self.streams: dict[int, H2Stream] = {}
        self.queued: deque[H2Stream] = deque()
        self.running = 0  # handlers started and not yet returned
        self.waiting_for_window: set[H2Stream] = set()
        self.writing_paused = False
        self._flush_scheduled = False
        self._drain: asyncio.Future[None] | None = None
        self._receiving = False
        self.goaway_sent = False  # graceful GOAWAY written: no new streams
        self.last_stream_id = 0
        self.closing = False  # error GOAWAY written (or the connection is gone): nothing is served
        self._settled = False  # the client's first SETTINGS arrived
        self._idle_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._handlers: dict[type[events.Event], Callable[[Any], None]] = {
            events.RequestReceived: self._on_request,
            events.DataReceived: self._on_data,
            events.StreamEnded: self._on_stream_ended,
            events.StreamReset: self._on_stream_reset,
            events.WindowUpdated: self._on_window_updated,
            events.RemoteSettingsChanged: self._on_settings,
            events.ConnectionTerminated: self._on_client_goaway,
        }

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no subclass of asyncio.Transport, but it is one.
        self.transport = cast(asyncio.Transport, transport)
        self.info = Connection.of_transport(transport, protocol=HTTP2)
        self.ssl_context = transport.get_extra_info("sslcontext")
        self.peername = transport.get_extra_info("peername")
        self.sockname = transport.get_extra_info("sockname")
        limits = self.limits
        h2 = self.h2
        h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_streams,
                SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
                SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
                SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
            },
        )
        h2.max_inbound_frame_size = limits.max_frame_size
        h2.decoder.max_header_list_size = limits.max_header_list_size
        h2.initiate_connection()
        h2.increment_flow_control_window(limits.connection_window - INITIAL_CONNECTION_WINDOW)
        self.flush()
        self.serving.opened(self)
        self._idle_since = self.loop.time()
        self._timer = self.loop.call_later(limits.preface_timeout, self._on_timer)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # after an error GOAWAY: read and drop until the close
        self._receiving = True
        try:
            self.guard.inspect(data)
            handlers = self._handlers
            # h2 decodes a whole read before it reports any event: in slices, a flood (rapid
            # reset) is cut a slice past its limit instead of after every stream of a 256 KiB
            # read was decoded, while the other connections wait.
            for start in range(0, len(data), RECEIVE_SLICE):
                for event in self.h2.receive_data(data[start : start + RECEIVE_SLICE]):
                    handler = handlers.get(type(event))
                    if handler is not None:
                        handler(event)
                    if self.closing:
                        break
                if self.closing:
                    break
        except Violation as violation:
            self._fail(violation.reason, violation.code, str(violation))
        except ProtocolError as err:
            # h2 has already written its GOAWAY (the error code it chose) to its send buffer.
            reason = "header_list" if isinstance(err, DenialOfServiceError) else "protocol_error"
            self._fail(reason, None, str(err) or type(err).__name__)
        finally:
            self._receiving = False
        self.flush()

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

    # --- what streams ask of their connection ------------------------------------------------------

    def flush(self) -> None:
        """Write what h2 has to send once this turn of the event loop is over: the frames of every
        stream answered in one turn leave in one TLS write (one encryption, one system call)
        instead of one per frame, which is most of what HTTP/2 costs beyond HTTP/1.1."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.write_out)

    def write_out(self) -> None:
        """Write what h2 has to send now."""
        self._flush_scheduled = False
        data = self.h2.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

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

    def acknowledge(self, stream_id: int, size: int) -> None:
        """Body bytes were consumed: hand their window back to the client."""
        if self.closing or not size:
            return
        self.h2.acknowledge_received_data(size, stream_id)
        if not self._receiving:
            self.flush()

    def reset_stream(self, stream: H2Stream, code: ErrorCodes) -> None:
        """Reset one stream from the gateway's side (a cut answer, a refused head)."""
        if self.closing or stream.reset:
            return
        self.h2.reset_stream(stream.id, code)
        stream.was_reset()
        if not self._receiving:
            self.flush()

    def shut_down(self, reason: str = "shutdown") -> None:
        """Graceful GOAWAY: serve the streams received so far, refuse later ones, close when done."""
        transport = self.transport
        if self.goaway_sent or self.closing or transport is None:
            return
        self._write_goaway()
        self.goaway_sent = True
        self.serving.metrics.goaway(reason)
        if not self.streams and not self.queued:
            self._close_after_goaway()

    def _write_goaway(self) -> None:
        """A GOAWAY NO_ERROR naming the last stream received, written beside h2 (which would
        otherwise end the connection at once)."""
        self.write_out()  # the frames h2 holds go first
        self.last_stream_id = self.h2.highest_inbound_stream_id
        goaway = GoAwayFrame(0, last_stream_id=self.last_stream_id, error_code=ErrorCodes.NO_ERROR)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(goaway.serialize())

    def close(self) -> None:
        """The server is closing: cut whatever is left."""
        self.closing = True
        for stream in [*self.streams.values(), *self.queued]:
            stream.was_reset()
        self.queued.clear()
        if self.transport is not None:
            self.write_out()
            self.transport.close()

    # --- events ------------------------------------------------------------------------------------

    def _on_request(self, event: events.RequestReceived) -> None:
        sid = event.stream_id
        if self.goaway_sent and sid > self.last_stream_id:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        try:
            head = self.serving.names.request(event.headers or ())
        except BadRequest as err:
            log.info("HTTP/2 request refused", extra=fields(remote=self.info.remote, reason=str(err)))
            self._spend_reset()
            self.h2.reset_stream(sid, ErrorCodes.PROTOCOL_ERROR)
            return
        stream = H2Stream(self, sid)
        if event.stream_ended is not None or head.headers.get("Content-Length") == "0":
            payload: StreamReader = EMPTY_PAYLOAD
        else:
            body = StreamReader(cast(Any, stream), self.limits.body_buffer, loop=self.loop)
            payload = stream.reader = body
        stream.request = stream_request(
            H2Request,
            method=head.method,
            target=head.target,
            headers=head.headers,
            payload=payload,
            protocol=stream,
            writer=ResponseWriter(stream),
            task=None,
            loop=self.loop,
            client_max_size=self.serving.client_max_size,
        )
        self.streams[sid] = stream
        self._idle_since = None
        if self.running < self.limits.max_streams:
            self._start(stream)
            return
        self.queued.append(stream)
        if len(self.queued) > self.limits.max_queued_handlers:
            raise Violation(
                "rapid_reset",
                ErrorCodes.ENHANCE_YOUR_CALM,
                f"more than {self.limits.max_queued_handlers} streams waiting for a handler",
            )

    def _on_data(self, event: events.DataReceived) -> None:
        sid = event.stream_id
        stream = self.streams.get(sid)
        size = event.flow_controlled_length or 0
        if stream is None:
            if size:
                self.h2.acknowledge_received_data(size, sid)
            return
        stream.feed(event.data or b"", size)

    def _on_stream_ended(self, event: events.StreamEnded) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is not None:
            stream.feed_eof()

    def _on_stream_reset(self, event: events.StreamReset) -> None:
        # The client's reset, or one h2 sent because of the client's error (remote_reset False).
        self._spend_reset()
        stream = self.streams.get(event.stream_id)
        if stream is not None:
            stream.was_reset()

    def _on_window_updated(self, event: events.WindowUpdated) -> None:
        if event.stream_id:
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.window_changed()
            return
        for stream in list(self.waiting_for_window):
            stream.window_changed()

    def _on_settings(self, event: events.RemoteSettingsChanged) -> None:
        self._settled = True
        if SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for stream in list(self.waiting_for_window):
                stream.window_changed()

    def _on_client_goaway(self, event: events.ConnectionTerminated) -> None:
        """The client is leaving: answer with a GOAWAY (as Go's server does) and close. The h2
        library allows nothing more on a connection once the client's GOAWAY arrived, so streams
        still in flight end here (Go's server would finish them)."""
        self._write_goaway()
        self._fail("client_goaway", None, f"client sent GOAWAY ({event.error_code!r})", log_it=False)

    # --- handlers -----------------------------------------------------------------------------------

    def _start(self, stream: H2Stream) -> None:
        self.running += 1
        task = stream.task = self.loop.create_task(self._serve(stream))
        task.add_done_callback(lambda _task: self._handler_done(stream))

    async def _serve(self, stream: H2Stream) -> None:
        request = stream.request
        try:
            try:
                response = await self.serving.handler(request)
            except web.HTTPException as exc:
                response = exc
            await response.prepare(request)
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            pass  # the stream was reset or the connection is gone: nobody to answer
        except Exception:
            log.exception("HTTP/2 stream failed", extra=fields(method=request.method, path=request.path))

    def _handler_done(self, stream: H2Stream) -> None:
        self.running -= 1
        self.streams.pop(stream.id, None)
        if not self.closing and not stream.reset:
            h2_stream = self.h2.streams.get(stream.id)
            if h2_stream is not None and not h2_stream.closed:
                # Answered while the client still sends (NO_ERROR, as Go's server), or not answered
                # to the end (the handler failed after its head went out).
                code = ErrorCodes.NO_ERROR if stream.ended else ErrorCodes.INTERNAL_ERROR
                self.h2.reset_stream(stream.id, code)
            stream.reset = True
        queued = self.queued
        while queued and self.running < self.limits.max_streams:
            waiting = queued.popleft()
            if waiting.reset:  # reset before it started: skipped, as Go's `handlerDone`
                self.streams.pop(waiting.id, None)
            else:
                self._start(waiting)
        if not self.streams:
            if self.goaway_sent:
                self._close_after_goaway()
            else:
                self._idle_since = self.loop.time()
        self.flush()

    # --- ending --------------------------------------------------------------------------------------

    def _spend_reset(self) -> None:
        if not self.resets.take():
            raise Violation(
                "reset_flood",
                ErrorCodes.ENHANCE_YOUR_CALM,
                f"stream resets beyond {self.limits.reset_burst} at once or {self.limits.reset_rate:g}/s",
            )

    def _fail(self, reason: str, code: ErrorCodes | None, detail: str, *, log_it: bool = True) -> None:
        """End the connection now: GOAWAY `code` (None: already written), handlers cancelled."""
        if self.closing:
            return
        if log_it:
            log.info(
                "HTTP/2 connection ended by a limit or a protocol error",
                extra=fields(remote=self.info.remote, reason=reason, detail=detail),
            )
        self.serving.metrics.goaway(reason)
        if code is not None:
            self.h2.close_connection(error_code=code)
        self.flush()
        self.closing = True
        for stream in [*self.streams.values(), *self.queued]:
            stream.was_reset()
        self.queued.clear()
        transport = self.transport
        if transport is None:
            return
        if reason == "control_queue":
            transport.abort()  # the client reads nothing: the GOAWAY would never reach it
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(self.limits.goaway_timeout, transport.close)

    def _close_after_goaway(self) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        self.closing = True
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
