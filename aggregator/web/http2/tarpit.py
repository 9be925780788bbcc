"""The listener's gate: where a connection from a penalised address waits (`penalty.py`).

Each connection's first protocol is a `Gate`, which asks the penalties once TLS is up: no penalty,
it hands the connection to the ALPN dispatch at once (in the same call: nothing is read in
between); penalised, the connection is held, unread and unserved, until the penalty ends, then
handed over; past the per-address bound, it is closed at once. A held connection that goes away is
forgotten; the server's close closes those held.

The gate stands after the TLS handshake, not before it: the event loop (uvloop) starts the
handshake as soon as it accepts, and a plain-TCP listener that starts TLS itself (`start_tls`) loses
the ClientHello, which uvloop reads before a protocol can pause it. So a penalised address still
pays the gateway one handshake per connection; what the gate takes away is the loop: a flooder that
waits for its connection's answer gets one connection per penalty instead of fifty a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aggregator.util.logs import fields
from aggregator.util.logthrottle import LogThrottle
from aggregator.web.http2.penalty import Penalties

log = logging.getLogger(__name__)


class Tarpit:
    """The listener's protocol factory: a `Gate` per connection, in front of `app` (the ALPN
    dispatch)."""

    def __init__(self, app: Callable[[], asyncio.BaseProtocol], penalties: Penalties) -> None:
        self.app = app
        self.penalties = penalties
        self.held: set[Gate] = set()
        # A flooder's refused connections come in floods: one line per period, with their count.
        self.refusals = LogThrottle()

    def __call__(self) -> Gate:
        return Gate(self)

    def close(self) -> None:
        """The server closes: connections still held are closed unserved."""
        for gate in list(self.held):
            gate.close()


class Gate(asyncio.Protocol):
    """One connection until it is served (see the module docstring)."""

    __slots__ = ("_address", "_data", "_eof", "_tarpit", "_timer", "_transport")

    def __init__(self, tarpit: Tarpit) -> None:
        self._tarpit = tarpit
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._address: str | None = None
        self._data: list[bytes] = []  # what arrived while held (reading is paused: a record or so)
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple | list) and peer else None
        tarpit = self._tarpit
        wait = tarpit.penalties.admit(address)
        if wait is None:
            refused = tarpit.refusals.count()
            if refused:
                log.info(
                    "connections of an address penalised for a flood refused",
                    extra=fields(remote=address, connections=refused),
                )
            transport.close()
            return
        if not wait:
            tarpit.app().connection_made(transport)
            return
        log.info(
            "connection of an address penalised for a flood held",
            extra=fields(remote=address, seconds=round(wait, 3)),
        )
        _reading(transport).pause_reading()
        self._transport = transport
        self._address = address
        tarpit.held.add(self)
        self._timer = asyncio.get_running_loop().call_later(wait, self._release)

    def data_received(self, data: bytes) -> None:
        self._data.append(data)

    def eof_received(self) -> bool | None:
        self._eof = True
        return True  # the protocol it is handed to decides

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed while held (by the client, or `close`)."""
        self._forget()
        self._transport = None

    def close(self) -> None:
        transport = self._transport
        self._forget()
        if transport is not None:
            transport.close()

    def _release(self) -> None:
        """The penalty is over: served as if it had just arrived, with what it sent meanwhile."""
        self._timer = None
        self._forget()
        transport, self._transport = self._transport, None
        if transport is None or transport.is_closing():
            return
        self._tarpit.app().connection_made(transport)  # the dispatch sets the protocol it chose
        _reading(transport).resume_reading()  # no loop turn before the replay: nothing overtakes it
        target = transport.get_protocol()
        if isinstance(target, asyncio.Protocol):
            for data in self._data:
                target.data_received(data)
            if self._eof and not target.eof_received():
                transport.close()
        self._data.clear()

    def _forget(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self in self._tarpit.held:
            self._tarpit.held.discard(self)
            assert self._address is not None
            self._tarpit.penalties.release(self._address)


def _reading(transport: asyncio.BaseTransport) -> asyncio.ReadTransport:
    # uvloop's TLS transport is no subclass of asyncio.ReadTransport, but it is one.
    return transport  # type: ignore[return-value]
