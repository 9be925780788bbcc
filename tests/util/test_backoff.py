"""Retry delays shared by every background loop."""

from __future__ import annotations

from aggregator.util.backoff import Backoff, exponential_delay


def test_exponential_delay_doubles_from_the_first_failure_and_caps() -> None:
    assert [exponential_delay(n, 0.5, 60) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 32, 60, 60]
    assert exponential_delay(0, 0.5, 60) == 0.5
    assert exponential_delay(10_000, 0.5, 60) == 60


def test_backoff_is_exponential_jittered_and_capped_at_30s() -> None:
    top = Backoff(0.5, 30.0, rng=lambda: 0.0)
    assert [top.next() for _ in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    top.reset()
    assert top.next() == 0.5
    jittered = Backoff(0.5, 30.0, jitter=0.5, rng=lambda: 1.0)
    assert [jittered.next() for _ in range(8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    real = Backoff()
    delays = [real.next() for _ in range(50)]
    assert all(0 < d <= 30.0 for d in delays) and max(delays[10:]) > 15.0
    assert len(set(delays[10:])) > 1  # jitter spreads retries
