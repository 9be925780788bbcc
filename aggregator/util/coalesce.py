"""One run for a burst of requests: how derived documents keep up with thousands of changes.

At start-up a gateway with thousands of APIServices sees thousands of store events and discovery
fetches within seconds; re-rendering every document for each of them made start-up quadratic.
`Throttled.request()` asks for a run: the first request after a quiet spell runs at the next
turn of the event loop (a single edit shows up at once), and further requests within `interval`
of the last run fold into one run at the end of that interval (no request is ever lost, the cost
per second is bounded whatever the rate of changes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aggregator.util.logs import fields

log = logging.getLogger(__name__)


class Throttled:
    def __init__(self, run: Callable[[], None], *, interval: float, name: str) -> None:
        self._run = run
        self.interval = interval
        self.name = name
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._last = float("-inf")
        self.runs = 0

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def request(self) -> None:
        """Run soon; without a running event loop (a unit test driving objects directly) the caller
        is expected to bring its state up to date on read."""
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        due = self._last + self.interval
        now = loop.time()
        self._handle = loop.call_soon(self._fire) if due <= now else loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._last = asyncio.get_running_loop().time()
        self.runs += 1
        try:
            self._run()
        except Exception:
            log.exception("coalesced run failed", extra=fields(name=self.name))

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
