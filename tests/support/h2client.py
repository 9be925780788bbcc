"""A real HTTP/2 client for tests, on the h2 library over TLS with ALPN `h2`.

It speaks HTTP/2 as a well-behaved client does (`request`, `response`), and lets a test do what no
well-behaved client would: write raw frames, reset streams in bulk, stop reading, hold back its
flow-control window. Everything it receives is recorded (`streams`, `goaway`, `pings`, `closed`);
tests wait for a condition with `until`, which wakes on every frame read (lockstep, no sleeps).
`RawH2` writes frames as a test builds them, for what the h2 library would refuse to send.

    async with H2Client.connect(port, pki.client_context("admin")) as client:
        sid = client.request("GET", "/livez")
        answer = await client.response(sid)
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType

from h2 import events
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hpack import Decoder, Encoder
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

GOAWAY = 0x7
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(frozen=True)
class Goaway:
    last_stream_id: int
    error_code: ErrorCodes


@dataclass
class StreamState:
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: ErrorCodes | int | None = None
    received_frames: int = 0  # DATA frames

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


class H2Client:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        auto_ack: bool = True,
        settings: dict[int, int] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.auto_ack = auto_ack  # hand DATA's window back as soon as it is read
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.streams: dict[int, StreamState] = {}
        self.goaway: Goaway | None = None
        self._buffer = bytearray()
        self.pings: list[bytes] = []
        self.remote_settings: dict[int, int] = {}
        self.closed = False
        self.received_bytes = 0
        self._changed = asyncio.Event()
        self._reading = asyncio.Event()
        self._reading.set()
        self.flush()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        port: int,
        context: ssl.SSLContext,
        *,
        host: str = "127.0.0.1",
        auto_ack: bool = True,
        settings: dict[int, int] | None = None,
        local: str | None = None,
    ) -> AsyncIterator[H2Client]:
        """`local`: the source address (another loopback address is another client)."""
        context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, limit=2**20, local_addr=(local, 0) if local else None
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = cls(reader, writer, auto_ack=auto_ack, settings=settings)
        try:
            yield client
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    async def __aenter__(self) -> H2Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # --- sending -------------------------------------------------------------------------------------

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def send_raw(self, data: bytes) -> None:
        self.flush()
        self.writer.write(data)

    def request(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]] = (),
        *,
        body: bytes | None = None,
        end: bool = True,
        authority: str = "gateway.test",
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        fields = [(":method", method), (":path", path), (":scheme", "https"), (":authority", authority)]
        fields.extend((k.lower(), v) for k, v in headers)
        self.streams[sid] = StreamState()
        self.h2.send_headers(sid, fields, end_stream=end and body is None)
        if body is not None:
            self.h2.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def send_data(self, sid: int, data: bytes, *, end: bool = False) -> None:
        self.h2.send_data(sid, data, end_stream=end)
        self.flush()

    def reset(self, sid: int, code: ErrorCodes = ErrorCodes.CANCEL) -> None:
        self.h2.reset_stream(sid, code)
        self.flush()

    def ping(self, opaque: bytes = b"12345678") -> None:
        self.h2.ping(opaque)
        self.flush()

    def acknowledge(self, sid: int, size: int) -> None:
        self.h2.acknowledge_received_data(size, sid)
        self.flush()

    def pause_reading(self) -> None:
        """Stop reading from the socket: what the server writes piles up in its buffers."""
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    # --- receiving -----------------------------------------------------------------------------------

    async def until(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """Wait until `condition()` holds; re-checked after every read."""
        async with asyncio.timeout(timeout):
            while not condition():
                if self.closed and not condition():
                    raise AssertionError("connection closed before the condition held")
                self._changed.clear()
                await self._changed.wait()

    async def response(self, sid: int, timeout: float = 20.0) -> Response:
        state = self.streams[sid]
        await self.until(lambda: state.ended or state.reset is not None, timeout)
        assert state.reset is None, f"stream {sid} reset: {state.reset!r}"
        assert state.status is not None
        return Response(state.status, state.headers, bytes(state.body))

    async def get(self, path: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
        return await self.response(self.request("GET", path, headers))

    async def _read_loop(self) -> None:
        try:
            while True:
                await self._reading.wait()
                data = await self.reader.read(65536)
                if not data:
                    break
                self.received_bytes += len(data)
                for event in self.h2.receive_data(self._without_goaway(data)):
                    self._on_event(event)
                self.flush()
                self._changed.set()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _without_goaway(self, data: bytes) -> bytes:
        """The frames read, minus GOAWAY, which is recorded here: the h2 library ends a connection
        on a GOAWAY it receives, where a real client (Go's, curl's) reads the streams the GOAWAY
        let finish."""
        self._buffer += data
        buffer = self._buffer
        keep = bytearray()
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            frame_bytes = bytes(buffer[: 9 + length])
            del buffer[: 9 + length]
            if frame_bytes[3] == GOAWAY:
                frame, _ = Frame.parse_frame_header(memoryview(frame_bytes[:9]))
                frame.parse_body(memoryview(frame_bytes[9:]))
                assert isinstance(frame, GoAwayFrame)
                self.goaway = Goaway(frame.last_stream_id, ErrorCodes(frame.error_code))
            else:
                keep += frame_bytes
        return bytes(keep)

    def _on_event(self, event: events.Event) -> None:
        if isinstance(event, events.ResponseReceived):
            state = self.streams.setdefault(event.stream_id, StreamState())
            headers = [(str(k), str(v)) for k, v in event.headers or ()]
            state.status = int(next(v for k, v in headers if k == ":status"))
            state.headers = [(k, v) for k, v in headers if not k.startswith(":")]
        elif isinstance(event, events.DataReceived):
            state = self.streams.setdefault(event.stream_id, StreamState())
            state.body += event.data or b""
            state.received_frames += 1
            if self.auto_ack and event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, events.StreamEnded):
            self.streams.setdefault(event.stream_id, StreamState()).ended = True
        elif isinstance(event, events.StreamReset):
            self.streams.setdefault(event.stream_id, StreamState()).reset = event.error_code
        elif isinstance(event, events.PingAckReceived):
            self.pings.append(event.ping_data or b"")
        elif isinstance(event, events.RemoteSettingsChanged):
            for code, setting in event.changed_settings.items():
                self.remote_settings[int(code)] = setting.new_value

    @property
    def max_streams(self) -> int | None:
        return self.remote_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)


class RawH2:
    """An HTTP/2 client that sends frames exactly as a test builds them (no state machine to stop
    it from breaking the protocol) and records what comes back: GOAWAY, resets, answered streams,
    PING acknowledgements."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: dict[int, int] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.goaway: Goaway | None = None
        self.resets: dict[int, int] = {}
        self.answered: set[int] = set()  # streams whose response HEADERS arrived
        self.statuses: dict[int, int] = {}  # their :status
        self.ended: set[int] = set()  # streams the gateway ended (END_STREAM)
        self.ping_acks = 0
        self.closed = False
        self._buffer = bytearray()
        self._changed = asyncio.Event()
        writer.write(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        port: int,
        context: ssl.SSLContext,
        settings: dict[int, int] | None = None,
        *,
        local: str | None = None,
    ) -> AsyncIterator[RawH2]:
        """`settings`: the client's SETTINGS (e.g. `{0x4: 0}`, an initial window of 0); `local`:
        the source address."""
        context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, limit=2**20, local_addr=(local, 0) if local else None
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = cls(reader, writer, settings)
        try:
            yield client
        finally:
            client._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await client._task
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # --- frames --------------------------------------------------------------------------------------

    def block(self, method: str, path: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
        """A header block exactly as given: no validation of names or values (attack tests)."""
        fields = [(":method", method), (":path", path), (":scheme", "https"), (":authority", "gateway.test")]
        return bytes(self.encoder.encode([*fields, *extra]))

    def headers(
        self,
        sid: int,
        method: str = "GET",
        path: str = "/livez",
        *,
        end_stream: bool = True,
        block: bytes | None = None,
    ) -> bytes:
        frame = HeadersFrame(sid, block if block is not None else self.block(method, path))
        frame.flags.add("END_HEADERS")
        if end_stream:
            frame.flags.add("END_STREAM")
        return frame.serialize()

    def send(self, *frames: bytes | Frame) -> None:
        self.writer.write(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))

    async def until(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                if self.closed:
                    raise AssertionError("connection closed before the condition held")
                self._changed.clear()
                await self._changed.wait()

    async def round_trip(self) -> None:
        """A PING answered: everything sent before it was read by the gateway."""
        acks = self.ping_acks
        self.send(PingFrame(0, b"roundtrp"))
        await self.until(lambda: self.ping_acks > acks or self.goaway is not None)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self._buffer += data
                self._parse()
                self._changed.set()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _parse(self) -> None:
        buffer = self._buffer
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(bytes(buffer[:9])))
            if len(buffer) < 9 + length:
                return
            frame.parse_body(memoryview(bytes(buffer[9 : 9 + length])))
            del buffer[: 9 + length]
            if isinstance(frame, GoAwayFrame):
                self.goaway = Goaway(frame.last_stream_id, ErrorCodes(frame.error_code))
            elif isinstance(frame, RstStreamFrame):
                self.resets[frame.stream_id] = frame.error_code
            elif isinstance(frame, HeadersFrame):
                self.answered.add(frame.stream_id)
                for name, value in self.decoder.decode(bytes(frame.data)):
                    if name in (":status", b":status"):
                        self.statuses[frame.stream_id] = int(value)
            elif isinstance(frame, PingFrame) and "ACK" in frame.flags:
                self.ping_acks += 1
            elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                self.writer.write(SettingsFrame(0, flags=["ACK"]).serialize())
            if isinstance(frame, HeadersFrame | DataFrame) and "END_STREAM" in frame.flags:
                self.ended.add(frame.stream_id)


async def negotiated_alpn(
    port: int, context: ssl.SSLContext, offered: list[str] | None
) -> tuple[str | None, bytes]:
    """Connect offering `offered` with ALPN (None: no ALPN) and ask `/livez?verbose` over
    HTTP/1.1 when that is what was chosen: the protocol chosen, and the answer (which names the
    worker)."""
    if offered is not None:
        context.set_alpn_protocols(offered)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
    answer = b""
    if chosen in (None, "http/1.1"):
        writer.write(b"GET /livez?verbose HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
    writer.close()
    with contextlib.suppress(ssl.SSLError, ConnectionError):  # an h2 server speaks first (SETTINGS)
        await writer.wait_closed()
    return chosen, answer
