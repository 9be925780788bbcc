"""The queueset's shortcuts (a request dispatched as it arrives skips its queue's round trip; a request
finishing where nothing waits skips the dispatch pass) leave exactly the state upstream's code path
leaves: generated sequences of arrivals, finishes, cancellations and passing time, run on a queueset
with the shortcuts and on one without, compared after every step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.flowcontrol.controller import hash_flow
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.flowcontrol.queueset import QueueSet, QueuingConfig, Request, WorkEstimate

FLOWS = ("alice", "bob", "carol", "dave")


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def queueset(clock: Clock, shortcuts: bool, limit: int, queues: int, exempt: bool) -> QueueSet:
    qs = QueueSet(
        QueuingConfig("l"),
        FlowControlMetrics(None).level("l"),
        clock=clock,
        call_later=lambda _d, _f: None,
        shortcuts=shortcuts,
    )
    config = QueuingConfig("l", -1) if exempt else QueuingConfig("l", queues, 3, min(2, queues))
    qs.set_configuration(config, limit, max(limit, 1))
    return qs


def snapshot(qs: QueueSet) -> dict[str, Any]:
    m = qs.metrics
    return {
        "r": qs.current_r,
        "robin": qs.robin_index,
        "enqueues": qs.enqueues,
        "waiting": (qs.waiting_requests, qs.waiting_seats),
        "executing": (qs.executing_requests, qs.seats_in_use),
        "queues": [(q.next_dispatch_r, q.executing, q.seats_in_use, len(q.waiting)) for q in qs.queues],
        "active": qs.active_queues,
        "flows": {
            fs: (s.inqueue_requests, s.inqueue_seats, s.executing_requests, s.executing_seats, s.rejected)
            for fs, s in m.flows.items()
        },
        "dispatch": m.dispatch,
        "state": m.state.state,
        "times": m.state.times,
        "demand": (m.demand_min, m.demand_max),
    }


Step = tuple[str, int, int]  # (what, which, amount)
steps = st.lists(
    st.tuples(st.sampled_from(["arrive", "arrive", "finish", "cancel", "wait"]), st.integers(0, 3), st.integers(1, 3)),
    max_size=40,
)


def run(shortcuts: bool, limit: int, queues: int, exempt: bool, plan: list[Step]) -> list[dict[str, Any]]:
    async def scenario() -> list[dict[str, Any]]:
        clock = Clock()
        qs = queueset(clock, shortcuts, limit, queues, exempt)
        stats = qs.metrics.flow("fs")
        live: list[Request] = []
        seen = []
        for what, which, amount in plan:
            if what == "arrive":
                flow = hash_flow("fs", FLOWS[which])
                request = qs.start_one(flow, stats) if amount == 1 else None
                if request is None:
                    request = qs.start_request(WorkEstimate(amount), flow, stats)
                if request is not None:
                    live.append(request)
            elif what == "finish":
                running = [r for r in live if r.executing]
                if running:
                    request = running[which % len(running)]
                    qs.finish(request)
                    live.remove(request)
            elif what == "cancel":
                queued = [r for r in live if r.waiting]
                if queued:
                    request = queued[which % len(queued)]
                    qs.cancel(request)
                    live.remove(request)
            else:
                clock.now += 0.001 * amount
            seen.append(snapshot(qs))
        return seen

    return asyncio.run(scenario())


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(0, 4), queues=st.integers(1, 4), exempt=st.booleans(), plan=steps)
def test_the_shortcuts_leave_the_state_upstreams_path_leaves(
    limit: int, queues: int, exempt: bool, plan: list[Step]
) -> None:
    assert run(True, limit, queues, exempt, plan) == run(False, limit, queues, exempt, plan)


def test_the_comparison_sees_a_difference_when_there_is_one() -> None:
    """The snapshot is sharp enough: one extra dispatch is noticed."""
    plan: list[Step] = [("arrive", 0, 1), ("wait", 0, 2), ("arrive", 1, 1)]
    same: Callable[[], list[dict[str, Any]]] = lambda: run(True, 2, 4, False, plan)  # noqa: E731
    assert same() == run(False, 2, 4, False, plan)
    assert same() != run(False, 2, 4, False, plan[:2])
