"""The request path's bound counters and histograms scrape exactly as prometheus_client's own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from aggregator.web.fastmetrics import FastHistogram, fast_inc


def _scrape_after(record: Callable[[Histogram, Counter], None]) -> bytes:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["l"], buckets=(0.005, 0.025, 1.0, 60.0), registry=registry)
    counter = Counter("c", "c", ["l"], registry=registry)
    record(histogram.labels("x"), counter.labels("x"))
    # Without the `_created` series: the time each was made.
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_the_request_paths_bound_observe_and_inc_scrape_as_prometheus_clients_own() -> None:
    # On the bounds, between them, below the first, above the last, zero and negative.
    amounts = (0.0, 0.005, 0.0050001, 0.02, 0.025, 0.5, 1.0, 59.9, 60.0, 61.0, 1e9, -1.0, 0.005)

    def slow(histogram: Histogram, counter: Counter) -> None:
        for amount in amounts:
            histogram.observe(amount)
            counter.inc()

    def fast(histogram: Histogram, counter: Counter) -> None:
        observe, inc = FastHistogram(histogram).observe, fast_inc(counter)
        for amount in amounts:
            observe(amount)
            inc(1)

    assert _scrape_after(fast) == _scrape_after(slow)
    assert b'h_bucket{l="x",le="0.005"} 4.0' in _scrape_after(fast)  # 0, 0.005 twice, -1
