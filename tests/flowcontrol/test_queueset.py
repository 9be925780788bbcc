"""One level's fair queuing (fairqueuing/queueset): who is dispatched when, who is refused, and how
virtual time moves. A fake clock drives time; requests finish when the test says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from aggregator.flowcontrol.controller import hash_flow
from aggregator.flowcontrol.metrics import SS_SCALE, FlowControlMetrics
from aggregator.flowcontrol.queueset import QueueSet, QueuingConfig, Request, WorkEstimate

ONE = WorkEstimate()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, callback in due:
            callback()


def queueset(clock: Clock, *, queues: int = 8, hand: int = 2, qll: int = 5, limit: int = 1) -> QueueSet:
    qs = QueueSet(QueuingConfig("l"), FlowControlMetrics(None).level("l"), clock=clock, call_later=clock.call_later)
    qs.set_configuration(QueuingConfig("l", queues, qll, hand), limit, max(limit, 1))
    return qs


def started(qs: QueueSet, flow: str, work: WorkEstimate = ONE) -> Request:
    request = qs.start_request(work, hash_flow("fs", flow), qs.metrics.flow("fs"))
    assert request is not None
    return request


async def test_a_request_that_finds_a_free_seat_runs_at_once_and_one_that_does_not_waits_its_turn() -> None:
    clock = Clock()
    qs = queueset(clock)
    first = started(qs, "alice")
    assert first.decided is None and first.executing
    second = started(qs, "alice")
    assert second.decided is not None and second.waiting
    stats = qs.metrics.flow("fs")
    assert (stats.inqueue_requests, stats.executing_requests) == (1, 1)
    clock.advance(0.01)
    qs.finish(first)
    assert await qs.wait(second, 1.0) and second.executing
    assert stats.inqueue_requests == 0


async def test_a_light_flow_overtakes_a_heavy_one_that_arrived_first() -> None:
    """Fair queuing: bob's one request goes before the most of alice's backlog."""
    clock = Clock()
    qs = queueset(clock, queues=64, hand=1, qll=50)
    running = started(qs, "alice")
    backlog = [started(qs, "alice") for _ in range(10)]
    clock.advance(0.001)
    bob = started(qs, "bob")
    order: list[str] = []
    current = running
    for _ in range(11):
        clock.advance(0.01)
        qs.finish(current)
        current = next(r for r in [*backlog, bob] if r.executing)
        order.append("bob" if current is bob else "alice")
        if current in backlog:
            backlog.remove(current)
    assert order.index("bob") <= 1, order


async def test_a_full_queue_at_the_limit_refuses_and_a_reject_level_refuses_at_its_limit() -> None:
    clock = Clock()
    qs = queueset(clock, queues=1, hand=1, qll=2)
    started(qs, "alice")
    started(qs, "alice")
    started(qs, "alice")
    assert qs.start_request(ONE, hash_flow("fs", "alice"), qs.metrics.flow("fs")) is None
    assert qs.metrics.flow("fs").rejected == {"queue-full": 1}
    reject = QueueSet(QueuingConfig("r"), FlowControlMetrics(None).level("r"), clock=clock, call_later=clock.call_later)
    reject.set_configuration(QueuingConfig("r"), 2, 2)
    stats = reject.metrics.flow("fs")
    assert reject.start_request(ONE, 0, stats) is not None and reject.start_request(ONE, 0, stats) is not None
    assert reject.start_request(ONE, 0, stats) is None
    assert stats.rejected == {"concurrency-limit": 1}


async def test_a_request_wider_than_the_limit_runs_alone() -> None:
    clock = Clock()
    qs = queueset(clock, limit=2)
    wide = started(qs, "alice", WorkEstimate(5))
    assert wide.executing and qs.seats_in_use == 5
    narrow = started(qs, "bob")
    assert narrow.waiting  # nothing else runs beside it
    qs.finish(wide)
    assert narrow.executing


async def test_waiting_too_long_takes_the_request_out_of_its_queue() -> None:
    clock = Clock()
    qs = queueset(clock)
    started(qs, "alice")
    waiting = started(qs, "alice")
    assert not await qs.wait(waiting, 0.01)
    assert not waiting.waiting and not waiting.executing
    stats = qs.metrics.flow("fs")
    assert stats.rejected == {"time-out": 1} and stats.inqueue_requests == 0


async def test_final_seats_are_held_for_the_additional_latency() -> None:
    clock = Clock()
    qs = queueset(clock, limit=4)
    write = started(qs, "alice", WorkEstimate(1, 3, 0.005))
    assert qs.seats_in_use == 3
    qs.finish(write)
    assert qs.seats_in_use == 3 and qs.executing_requests == 0  # lingering on its final seats
    clock.advance(0.006)
    assert qs.seats_in_use == 0


async def test_virtual_time_advances_by_the_seats_in_use_over_the_active_queues() -> None:
    clock = Clock()
    qs = queueset(clock, queues=8, hand=1, limit=4)
    started(qs, "alice")
    started(qs, "bob")
    r0 = qs.current_r
    clock.advance(1.0)
    qs.start_request(ONE, hash_flow("fs", "carol"), qs.metrics.flow("fs"))
    # two seats in use, two active queues: one seat-second per second (in 1e-8 units)
    assert qs.current_r - r0 == SS_SCALE


@pytest.mark.parametrize("dispatch_first", [True, False])
async def test_a_cancelled_wait_leaves_no_seat_taken(dispatch_first: bool) -> None:
    clock = Clock()
    qs = queueset(clock)
    first = started(qs, "alice")
    waiting = started(qs, "alice")
    task = asyncio.create_task(qs.wait(waiting, 10))
    await asyncio.sleep(0)
    if dispatch_first:
        qs.finish(first)  # dispatched in the same instant the client goes away
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if waiting.executing:
        qs.finish(waiting)
    if not dispatch_first:
        qs.finish(first)
    assert qs.seats_in_use == 0 and qs.waiting_requests == 0 and qs.is_idle()
