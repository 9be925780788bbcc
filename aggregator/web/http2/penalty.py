"""Flood penalties: a source address whose HTTP/2 connection was cut with GOAWAY
ENHANCE_YOUR_CALM waits before its next connections are served.

A rapid-reset flooder cut after 32 streams simply reconnects: 40-95 floods a second, each paying
the gateway a TLS handshake and the decoding up to the cut, which left other clients 0.5-0.8x of
their requests per second. Penalised, its next connections are held, unread, until the penalty
ends (the `tarpit` gate, right after the TLS handshake), so its loop of connect, flood, cut runs at
one connection per penalty. The penalty is short and doubles while the address keeps flooding:
1 s, 2 s, 4 s ... up to 30 s; a cut more than `quiet` seconds after the last penalty ended starts
again at 1 s. At most
`held_per_address` connections of one address are held at once; more are closed at once, so
holding cannot exhaust the worker's descriptors.

Go's server (so kube-apiserver) has no such penalty: it cuts the connection and accepts the next.
Clients behind the same address as a flooder (a NAT, a shared egress proxy) wait with it: that is
why the penalty is short and ends by itself (docs/differences.md). State is per worker: each worker
accepts, and cuts, its own connections.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FloodPenalty:
    first: float = 1.0  # seconds, the first penalty of an address
    longest: float = 30.0  # the doubling stops here
    quiet: float = 60.0  # no cut for this long after a penalty ended: the next one is `first` again
    held_per_address: int = 8  # connections held at once per address; more are closed at once


class PenaltyCounter(Protocol):
    """Where held and refused connections are counted (`metrics.PenaltyMetrics`)."""

    def penalised(self, outcome: str) -> None: ...


@dataclass
class _Record:
    period: float  # the current penalty's length
    until: float  # when it ends (clock time)
    held: int = 0  # connections held now


class Penalties:
    """The penalised addresses of one worker, and how many of their connections are held."""

    def __init__(
        self, policy: FloodPenalty, metrics: PenaltyCounter, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._records: dict[str, _Record] = {}
        self._prune_at = 64

    def penalise(self, address: str | None) -> None:
        """A connection from `address` was cut for a flood. A cut while its penalty still runs (a
        connection that got in before it) does not lengthen it: one doubling per penalty."""
        if address is None:
            return
        now, policy = self._clock(), self.policy
        record = self._records.get(address)
        if record is None:
            self._prune(now)
            self._records[address] = _Record(policy.first, now + policy.first)
        elif now >= record.until:
            recent = now - record.until < policy.quiet
            record.period = min(2 * record.period, policy.longest) if recent else policy.first
            record.until = now + record.period

    def admit(self, address: str | None) -> float | None:
        """For a new connection: 0 (no penalty), the seconds to hold it (counted as held until
        `release`), or None: close it now."""
        record = self._records.get(address) if address is not None else None
        if record is None:
            return 0.0
        wait = record.until - self._clock()
        if wait <= 0:
            return 0.0
        if record.held >= self.policy.held_per_address:
            self.metrics.penalised("refused")
            return None
        record.held += 1
        self.metrics.penalised("delayed")
        return wait

    def release(self, address: str) -> None:
        """A held connection is let through, or went away."""
        record = self._records.get(address)
        if record is not None and record.held > 0:
            record.held -= 1

    def penalty(self, address: str) -> float:
        """The current (or last) penalty's length for `address`, 0 if it has none."""
        record = self._records.get(address)
        return record.period if record is not None else 0.0

    def _prune(self, now: float) -> None:
        """Forget addresses quiet for long (amortized: only once the table doubled)."""
        if len(self._records) < self._prune_at:
            return
        forget = now - self.policy.quiet
        self._records = {a: r for a, r in self._records.items() if r.held or r.until > forget}
        self._prune_at = max(64, 2 * len(self._records))
