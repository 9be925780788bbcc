"""API Priority and Fairness for one gateway process: the configuration followed, the controller, the
filter, and the periodic borrowing adjustment (`configController.Run`).

Built by the composition root when `--enable-priority-and-fairness` is on (the default): its
`gate` goes where max-in-flight would, `finished` among the finishers
and `head_going_out` among the head listeners (`assembly.build_request_path`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aggregator.flowcontrol.controller import BORROWING_ADJUSTMENT_PERIOD, Controller
from aggregator.flowcontrol.filter import PriorityAndFairness
from aggregator.flowcontrol.manifests import ConfigObjects
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.flowcontrol.sharing import SeatAllocator, SeatShare, wait_ready
from aggregator.flowcontrol.sources import ConfigSource
from aggregator.util.tasks import TaskSet
from aggregator.web.requestmetrics import RequestMetrics

log = logging.getLogger(__name__)


def _call_later(delay: float, callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_later(delay, callback)


class FlowControl:
    """A gateway component: follows `source`, digests every change, adjusts borrowing every 10 s."""

    def __init__(
        self,
        source: ConfigSource,
        *,
        server_concurrency_limit: int,
        metrics: FlowControlMetrics,
        apiserver: RequestMetrics,
        request_timeout: float,
        adjustment_period: float = BORROWING_ADJUSTMENT_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.metrics = metrics
        self.adjustment_period = adjustment_period
        self.clock = clock
        # --workers: the control process's division of the limits (`sharing.py`), or a worker's share.
        self.allocator: SeatAllocator | None = None
        self.share: SeatShare | None = None
        self.controller = Controller(server_concurrency_limit, metrics, clock=clock, call_later=_call_later)
        self.filter = PriorityAndFairness(self.controller, metrics, apiserver, request_timeout=request_timeout, clock=clock)
        self._tasks = TaskSet("priority-and-fairness")
        self.apply(source.current)
        source.add_listener(self.apply)

    def apply(self, config: ConfigObjects) -> None:
        """A new configuration: everything digested again (`digestConfigObjects`)."""
        self.controller.digest(config.levels, config.schemas)

    # --- --workers ------------------------------------------------------------------------------------

    def shared_by_workers(self) -> SeatAllocator:
        """In the control process of `--workers N`: divide every level's limit among the workers,
        from their combined seat demand."""
        allocator = self.allocator = SeatAllocator(self.controller, lambda: self.source.current)
        self.source.add_listener(allocator.config_changed)
        return allocator

    def in_worker(self, send: Callable[[object], None]) -> SeatShare:
        """In a worker process: take the configuration and this worker's share of the limits from the
        control process (`send` reaches it; its messages go to `receive`)."""
        share = self.share = SeatShare(self.controller, send)
        share.config_listeners.append(self.apply)
        return share

    def receive(self, message: object) -> bool:
        """A message from the control process (a worker's); True if it was APF's."""
        return self.share.receive(message) if self.share is not None else False

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.source.start()
        share = self.share
        if share is not None:
            share.hello()
            await wait_ready(share)
            self._tasks.spawn(self._report(share), name="seat-demand")
        else:
            self._tasks.spawn(self._adjust(), name="borrowing")

    async def stop(self) -> None:
        await self._tasks.close()
        await self.source.stop()

    async def _adjust(self) -> None:
        """`updateBorrowing` every period, from this process's demand or the workers'."""
        while True:
            await asyncio.sleep(self.adjustment_period)
            allocator = self.allocator
            self.controller.update_borrowing(demand=allocator.demand() if allocator is not None else None)

    async def _report(self, share: SeatShare) -> None:
        """A worker's seat demand, for the control's borrowing adjustment."""
        while True:
            await asyncio.sleep(self.adjustment_period)
            share.send(share.stats(self.clock()))
