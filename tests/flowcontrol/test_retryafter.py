"""`Retry-After` of refused requests: dropped_requests_tracker_test.go's steps, replayed."""

from __future__ import annotations

from aggregator.flowcontrol.retryafter import DroppedRequests


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_retry_after_grows_with_refusals_and_shrinks_without_them() -> None:
    clock = Clock()
    tracker = DroppedRequests(clock)
    steps = [(0, 5, 1), (1, 11, 2), (2, 1, 2), (3, 11, 4), (4, 1, 4), (7, 1, 8), (11, 1, 8), (15, 1, 7), (17, 1, 6), (21, 14, 5), (22, 1, 10)]
    start = clock.now
    for elapsed, dropped, retry_after in steps:
        clock.now = start + elapsed
        for _ in range(dropped):
            tracker.record("pl")
        assert tracker.retry_after("pl") == retry_after, elapsed


def test_each_priority_level_has_its_own() -> None:
    clock = Clock()
    tracker = DroppedRequests(clock)
    for i in range(10):
        tracker.record(f"pl-{i}")
    clock.now += 1
    for i in range(10):
        tracker.record(f"pl-{i}")
        assert tracker.retry_after(f"pl-{i}") == 1
    for _ in range(5):
        tracker.record("pl-0")
    clock.now += 1
    for i in range(10):
        tracker.record(f"pl-{i}")
        assert tracker.retry_after(f"pl-{i}") == (2 if i == 0 else 1)
    assert tracker.retry_after("other-pl") == 1
