"""The lean keep-alive HTTP/1.1 client every backend call uses: proxied requests, fetches, probes.

aiohttp's `ClientSession` spends about 180 µs of Python per request building a `ClientRequest`,
timers, traces and pool bookkeeping; a proxied GET needs none of it. This module writes the
request head itself and reads the answer with aiohttp's own protocol class (the C llhttp response
parser, a StreamReader per body with flow control), keeping idle connections per address.
Measured on loopback against nginx: ~25 µs per exchange instead of ~200 µs.

There is no cap on connections in use: like Go's transport (client-go sets no MaxConnsPerHost),
a thousand watches on one backend take a thousand connections and a plain GET beside them still
gets its own at once. Only idle connections are bounded: per address (`max_idle`, like
MaxIdleConnsPerHost: extras are closed when released, never waited for), and across every pool
of the gateway (`IdleConnections`, like MaxIdleConns: beyond its limit the connection idle
longest closes). An idle connection closes when its keep-alive ends, whether or not its address
is asked for again: a backend nobody calls any more holds no connection.

What it does not do, on purpose: follow redirects, decompress, add headers, use HTTP proxies,
speak HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
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
# Idle connections across every pool of the gateway (Go's MaxIdleConns is 100 in http.DefaultTransport;
# this one serves every backend at once, so more): the ones idle longest close beyond it.
MAX_IDLE = 1024


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
    lines = [f"{method} {target} HTTP/1.1", *[f"{name}: {value}" for name, value in headers]]
    # The lines without their terminators, searched for CR, LF and NUL by memchr: a third of the
    # cost of counting the line breaks of the whole head.
    joined = "".join(lines)
    if (
        "\n" in joined
        or "\r" in joined
        or "\0" in joined
        or not (method.isprintable() and target.isprintable())
        or " " in method
        or " " in target
    ):
        raise UnsafeHead(f"refusing to forward a request head with line breaks or whitespace: {method} {target!r}")
    lines.append("\r\n")  # the empty line that ends the head
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


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


class IdleConnections:
    """The idle keep-alive connections of every pool that shares it, oldest first.

    Beyond `limit` the connection idle longest closes, whichever backend it leads to; each closes
    at its deadline (the pool's keep-alive, or the spare keep-alive once a newer connection to
    the same address went idle) by one timer for all of them, so a connection nobody asks for
    again does not stay open until the backend drops it.
    """

    def __init__(self, limit: int = MAX_IDLE, *, timer: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._timer = timer
        # connection -> (its pool, address key), in the order they went idle
        self._order: collections.OrderedDict[ResponseHandler, tuple[H1Pool, Key]] = collections.OrderedDict()
        # each connection's deadline, and a heap of (deadline, n, connection) with stale entries
        self._deadline: dict[ResponseHandler, float] = {}
        self._heap: list[tuple[float, int, ResponseHandler]] = []
        self._seq = itertools.count()
        self._wakeup: asyncio.TimerHandle | None = None
        self._wakeup_at = float("inf")

    def __len__(self) -> int:
        return len(self._order)

    def add(self, pool: H1Pool, key: Key, protocol: ResponseHandler, deadline: float) -> None:
        """`protocol` just went idle in `pool`; the oldest beyond the limit close."""
        self._order[protocol] = (pool, key)
        self.expire_at(protocol, deadline)
        while len(self._order) > self.limit:
            oldest, (owner, owner_key) = next(iter(self._order.items()))
            owner.drop(owner_key, oldest)  # calls `taken`

    def expire_at(self, protocol: ResponseHandler, deadline: float) -> None:
        """Close `protocol` at `deadline` (monotonic seconds) unless it is taken before."""
        if protocol not in self._order or self._deadline.get(protocol) == deadline:
            return  # not idle, or already due then (a spare is told its deadline on every release)
        self._deadline[protocol] = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), protocol))
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._deadline):
            # Stale entries (connections taken since) outnumber live ones: rebuild.
            self._heap = [(d, next(self._seq), p) for p, d in self._deadline.items()]
            heapq.heapify(self._heap)
        if deadline < self._wakeup_at:
            self._schedule(deadline)

    def taken(self, protocol: ResponseHandler) -> None:
        """`protocol` is idle no more (reused or closed)."""
        if self._order.pop(protocol, None) is not None:
            del self._deadline[protocol]

    def _schedule(self, deadline: float) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # released outside a loop (a test's teardown): swept on the next add
            self._wakeup, self._wakeup_at = None, float("inf")
            return
        self._wakeup_at = deadline
        self._wakeup = loop.call_later(max(0.0, deadline - self._timer()), self._sweep)

    def _sweep(self) -> None:
        self._wakeup, self._wakeup_at = None, float("inf")
        now = self._timer()
        heap = self._heap
        while heap:
            deadline, _, protocol = heap[0]
            if self._deadline.get(protocol) != deadline:
                heapq.heappop(heap)  # taken since, or given a new deadline
                continue
            if deadline > now:
                self._schedule(deadline)
                return
            heapq.heappop(heap)
            pool, key = self._order[protocol]
            pool.drop(key, protocol)


@dataclass(eq=False)
class H1Pool:
    """Idle keep-alive connections per (address, port, TLS name); new ones come from `dial`."""

    dial: Dial
    _: KW_ONLY
    keepalive: float = KEEPALIVE
    spare_keepalive: float = SPARE_KEEPALIVE
    max_idle: int = MAX_IDLE_PER_KEY
    # The bound and the clock of idle connections, shared with every other backend's pool.
    everyone_idle: IdleConnections = field(default_factory=IdleConnections)
    _idle: dict[Key, collections.deque[tuple[ResponseHandler, float]]] = field(default_factory=dict, init=False)
    in_use: int = field(default=0, init=False)
    closed: bool = field(default=False, init=False)

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
            everyone = self.everyone_idle
            while idle:
                protocol, since = idle.pop()
                everyone.taken(protocol)
                if now - since < self.keepalive and protocol.is_connected():
                    if not idle:
                        del self._idle[key]
                    self.in_use += 1
                    return Exchange(self, key, protocol, True)
                protocol.close()
            del self._idle[key]
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
        protocol = await self.dial(host, port, server_name, within, times)
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
        everyone = self.everyone_idle
        # Whatever idled past the keep-alive goes; so do spares unused for the spare keep-alive,
        # since the connection released now stays warm.
        while idle and now - idle[0][1] >= self.spare_keepalive:
            spare = idle.popleft()[0]
            everyone.taken(spare)
            spare.close()
        if len(idle) >= self.max_idle:
            protocol.close()
            return
        for spare, since in idle:  # a newer one is warm now: these are spares
            everyone.expire_at(spare, since + self.spare_keepalive)
        idle.append((protocol, now))
        everyone.add(self, key, protocol, now + self.keepalive)

    def drop(self, key: Key, protocol: ResponseHandler) -> None:
        """Close an idle connection (its keep-alive ended, or the gateway holds too many)."""
        self.everyone_idle.taken(protocol)
        idle = self._idle.get(key)
        if idle is not None:
            for entry in idle:
                if entry[0] is protocol:
                    idle.remove(entry)
                    break
            if not idle:
                del self._idle[key]
        with contextlib.suppress(Exception):
            protocol.close()

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def close(self) -> None:
        """Close idle connections; those in use close when their exchange finishes."""
        self.closed = True
        for idle in self._idle.values():
            for protocol, _since in idle:
                self.everyone_idle.taken(protocol)
                with contextlib.suppress(Exception):
                    protocol.close()
        self._idle.clear()
