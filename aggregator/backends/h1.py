"""The lean keep-alive HTTP/1.1 client every backend call uses: proxied requests, fetches, probes.

aiohttp's `ClientSession` spends about 180 µs of Python per request building a `ClientRequest`,
timers, traces and pool bookkeeping; a proxied GET needs none of it. This module writes the
request head itself and reads the answer with aiohttp's own protocol class (the C llhttp response
parser, a StreamReader per body with flow control), keeping idle connections per address.
Measured on loopback against nginx: ~25 µs per exchange instead of ~200 µs.

There is no cap on connections in use: like Go's transport (client-go sets no MaxConnsPerHost),
a thousand watches on one backend take a thousand connections and a plain GET beside them still
gets its own at once. Only idle connections are bounded (`max_idle`, like MaxIdleConnsPerHost):
extras are closed when released, never waited for.

What it does not do, on purpose: follow redirects, decompress, add headers, use HTTP proxies,
speak HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from aggregator.backends._aiohttp import (
    RawResponseMessage,
    ResponseHandler,
    StreamReader,
    drain,
    prepare_response,
)
from aggregator.web.serverrequest import RequestBody

Key = tuple[str, int, str | None]


class DialTimes:
    """How long a new connection's TCP connect and TLS handshake took (seconds; None: not timed)."""

    __slots__ = ("tcp", "tls")

    def __init__(self) -> None:
        self.tcp: float | None = None
        self.tls: float | None = None


# Opens a connection to (host, port) verified for the TLS name within a time limit (None: the
# backend's default), noting its phases' times when given somewhere to; raises BackendError.
Dial = Callable[[str, int, str | None, float | None, DialTimes | None], Awaitable[ResponseHandler]]

MAX_LINE = 65536
READ_BUFSIZE = 1 << 16
# Go's http.Transport IdleConnTimeout: longer than the availability (30 s) and discovery (60 s)
# intervals, so the gateway's own background calls reuse their connections.
KEEPALIVE = 90.0
# Idle connections beyond the most recently used one close after this long: a burst of concurrent
# requests leaves spares that a steady load keeps using, but that a quiet backend does not need
# (an idle TLS connection costs about 55 KiB; 5000 backends with three spares each is 800 MiB).
SPARE_KEEPALIVE = 5.0
MAX_IDLE_PER_KEY = 64


class UnsafeHead(ValueError):
    """A request head that would not reach the backend as the gateway read it."""


def serialize_head(method: str, target: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """The request line and header block.

    Names and values come from a protocol module that refused CR, LF and NUL in them, and
    whitespace in the method and target (`web/http1/`, `web/http2/`), or from the gateway's own
    sanitized identity headers. Checked once more here, where bytes become a request: a stray line
    break or space would let the backend read a request other than the one the gateway authorized
    (UnsafeHead: the request fails, nothing is sent).
    """
    parts = [f"{method} {target} HTTP/1.1\r\n"]
    parts.extend(f"{name}: {value}\r\n" for name, value in headers)
    parts.append("\r\n")
    text = "".join(parts)
    lines = len(parts)
    if (
        text.count("\n") != lines
        or text.count("\r") != lines
        or "\0" in text
        or not (method.isprintable() and target.isprintable())
        or " " in method
        or " " in target
    ):
        raise UnsafeHead(f"refusing to forward a request head with line breaks or whitespace: {method} {target!r}")
    return text.encode("utf-8", "surrogateescape")


class NotWritten(ConnectionError):
    """The connection was closed before the request was written: the backend never saw it."""


class BodyTap(Protocol):
    """Sees every chunk of a request body as it is sent (the audit's bounded copy)."""

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...


class Exchange:
    """One request on one connection: send, read the answer, give the connection back."""

    __slots__ = ("_writer", "key", "message", "payload", "pool", "protocol", "reused")

    def __init__(self, pool: H1Pool, key: Key, protocol: ResponseHandler, reused: bool) -> None:
        self.pool = pool
        self.key = key
        self.protocol = protocol
        self.reused = reused
        self._writer: asyncio.Task[None] | None = None
        self.message: RawResponseMessage | None = None
        self.payload: StreamReader | None = None

    def send(
        self,
        head: bytes,
        body: RequestBody | None,
        *,
        chunked: bool,
        head_only: bool,
        tap: BodyTap | None = None,
    ) -> None:
        protocol = self.protocol
        transport = protocol.transport
        if transport is None or transport.is_closing():
            raise NotWritten("EOF")
        prepare_response(protocol, head_only=head_only, read_bufsize=READ_BUFSIZE, max_line=MAX_LINE)
        transport.write(head)
        if body is not None:
            # Kept on the exchange and cancelled by `finish`: the body never outlives the exchange.
            self._writer = asyncio.get_running_loop().create_task(self._send_body(body, chunked, tap))

    async def _send_body(self, body: RequestBody, chunked: bool, tap: BodyTap | None) -> None:
        protocol = self.protocol
        try:
            while chunk := await body.readany():
                transport = protocol.transport
                if transport is None:
                    return
                if tap is not None:
                    tap.feed(chunk)
                if chunked:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                else:
                    transport.write(chunk)
                await drain(protocol)
            if chunked and protocol.transport is not None:
                protocol.transport.write(b"0\r\n\r\n")
            if tap is not None:
                tap.finish()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The client's upload or the backend connection broke: the exchange cannot finish.
            protocol.close()

    async def response(self) -> tuple[RawResponseMessage, StreamReader]:
        """The final answer (informational 1xx answers other than 101 are skipped)."""
        while True:
            message, payload = await self.protocol.read()
            if not 100 <= message.code < 200 or message.code == 101:
                self.message, self.payload = message, payload
                return message, payload

    def finish(self) -> None:
        """Give the connection back if it ended cleanly, else close it."""
        writer = self._writer
        reusable = (
            self.payload is not None
            and self.payload.is_eof()
            and self.message is not None
            and not self.message.should_close
            and not self.protocol.should_close
            and (writer is None or writer.done())
        )
        if writer is not None and not writer.done():
            writer.cancel()
        self.pool.release(self.key, self.protocol, reusable)


class H1Pool:
    """Idle keep-alive connections per (address, port, TLS name); new ones come from `dial`."""

    def __init__(
        self,
        dial: Dial,
        *,
        keepalive: float = KEEPALIVE,
        spare_keepalive: float = SPARE_KEEPALIVE,
        max_idle: int = MAX_IDLE_PER_KEY,
    ) -> None:
        self._dial = dial
        self.keepalive = keepalive
        self.spare_keepalive = spare_keepalive
        self.max_idle = max_idle
        self._idle: dict[Key, collections.deque[tuple[ResponseHandler, float]]] = {}
        self.in_use = 0
        self.closed = False

    async def exchange(self, host: str, port: int, server_name: str | None) -> Exchange:
        """A connection ready for one request: an idle one if there is one, else a new one."""
        exchange = self.idle_exchange(host, port, server_name)
        if exchange is None:
            exchange = await self.new_exchange(host, port, server_name)
        return exchange

    def idle_exchange(self, host: str, port: int, server_name: str | None) -> Exchange | None:
        """An idle connection's exchange, without an await; None when there is none."""
        key = (host, port, server_name)
        idle = self._idle.get(key)
        if idle:
            now = time.monotonic()
            while idle:
                protocol, since = idle.pop()
                if now - since < self.keepalive and protocol.is_connected():
                    self.in_use += 1
                    return Exchange(self, key, protocol, True)
                protocol.close()
        return None

    async def new_exchange(
        self,
        host: str,
        port: int,
        server_name: str | None,
        *,
        within: float | None = None,
        times: DialTimes | None = None,
    ) -> Exchange:
        """An exchange on a new connection (dialed within `within` seconds, or the default)."""
        protocol = await self._dial(host, port, server_name, within, times)
        self.in_use += 1
        return Exchange(self, (host, port, server_name), protocol, False)

    def release(self, key: Key, protocol: ResponseHandler, reusable: bool) -> None:
        self.in_use -= 1
        if not reusable or self.closed or not protocol.is_connected():
            protocol.close()
            return
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = collections.deque()
        now = time.monotonic()
        # Whatever idled past the keep-alive goes; so do spares unused for the spare keep-alive,
        # since the connection released now stays warm.
        while idle and now - idle[0][1] >= self.spare_keepalive:
            idle.popleft()[0].close()
        if len(idle) >= self.max_idle:
            protocol.close()
            return
        idle.append((protocol, now))

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def close(self) -> None:
        """Close idle connections; those in use close when their exchange finishes."""
        self.closed = True
        for idle in self._idle.values():
            for protocol, _since in idle:
                with contextlib.suppress(Exception):
                    protocol.close()
        self._idle.clear()
