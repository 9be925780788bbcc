"""The `Retry-After` of a refused request: `pkg/util/flowcontrol/dropped_requests_tracker.go`.

Per priority level, the refusals of each second are counted; the suggested wait starts at 1 s,
doubles (up to 32 s) when at least three times as many requests as it was were refused over the
last `retryAfter` seconds (and it has not changed for that long), and shrinks by one second when
fewer than it were: clients of an overloaded level back off, and come back as it recovers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_RETRY_AFTER = 32


class _LevelStats:
    __slots__ = ("current_count", "current_unix", "history", "retry_after", "retry_after_update")

    def __init__(self) -> None:
        self.history: list[tuple[int, int]] = []  # (unix second, refusals)
        self.current_unix = 0
        self.current_count = 0
        self.retry_after = 1
        self.retry_after_update = 0

    def record(self, unix: int) -> None:
        if self.current_unix == unix:
            self.current_count += 1
            return
        self._update_history(self.current_unix, self.current_count)
        self.current_unix = unix
        self.current_count = 1
        self._update_retry_after(unix)

    def _update_history(self, unix: int, count: int) -> None:
        self.history.append((unix, count))
        max_history = min(2 * self.retry_after, MAX_RETRY_AFTER)
        start = 0
        while start < len(self.history) and unix - self.history[start][0] > max_history:
            start += 1
        if start:
            del self.history[:start]

    def _update_retry_after(self, unix: int) -> None:
        retry_after = self.retry_after
        dropped = 0
        for when, count in reversed(self.history):
            if unix - when > retry_after:
                break
            if when < unix:
                dropped += count
        if unix - self.retry_after_update >= retry_after and dropped >= 3 * retry_after:
            self.retry_after = min(retry_after * 2, MAX_RETRY_AFTER)
            self.retry_after_update = unix
            return
        if dropped < retry_after and retry_after > 1:
            self.retry_after = retry_after - 1


class DroppedRequests:
    """`droppedRequestsTracker`: refusals per priority level and the Retry-After they call for."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self.levels: dict[str, _LevelStats] = {}

    def record(self, level: str) -> None:
        stats = self.levels.get(level)
        if stats is None:
            stats = self.levels[level] = _LevelStats()
        stats.record(int(self.now()))

    def retry_after(self, level: str) -> int:
        stats = self.levels.get(level)
        return stats.retry_after if stats is not None else 1
