"""One log line per period for an event that can come in floods (requests refused with a 429).

A refusal is logged so an operator sees it, but a flood of refused requests must not become a
flood of log lines: the first refusal is logged, then at most one line per period, carrying how
many there were since the last line.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogThrottle:
    __slots__ = ("_clock", "_count", "_last", "every")

    def __init__(self, every: float = 10.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._count = 0
        self._last = float("-inf")

    def count(self) -> int:
        """Count one more event: how many to report when a line is due now, else 0 (and keep counting)."""
        self._count += 1
        now = self._clock()
        if now - self._last < self.every:
            return 0
        self._last = now
        due, self._count = self._count, 0
        return due
