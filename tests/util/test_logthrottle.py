"""A flood of refusals is one log line per period, carrying how many there were."""

from __future__ import annotations

from aggregator.util.logthrottle import LogThrottle


def test_the_first_event_is_due_then_one_line_per_period_with_the_count() -> None:
    now = [100.0]
    throttle = LogThrottle(10.0, clock=lambda: now[0])
    assert throttle.count() == 1  # the first refusal is logged at once
    seen = []
    for step in range(1, 25):  # one refusal a second
        now[0] = 100.0 + step
        seen.append(throttle.count())
    # Lines at t=110 and t=120, each with the refusals since the last line.
    assert [(i + 1, n) for i, n in enumerate(seen) if n] == [(10, 10), (20, 10)]
    assert sum(seen) + 1 == 21  # the 4 after t=120 wait for the next line


def test_a_quiet_period_makes_the_next_event_due_at_once() -> None:
    now = [0.0]
    throttle = LogThrottle(10.0, clock=lambda: now[0])
    assert throttle.count() == 1
    now[0] = 3.0
    assert throttle.count() == 0
    now[0] = 30.0
    assert throttle.count() == 2
