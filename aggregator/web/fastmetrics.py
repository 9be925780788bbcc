"""Counter and histogram children bound for the request path: the same values prometheus_client
updates (what Prometheus scrapes is the same), without its per-call checks.

`Counter.inc` and `Histogram.observe` check on every call that the metric's labels are complete
and the amount allowed, and `observe` walks the bucket bounds in Python: a few microseconds that
every request paid three or four times over. The children the request path records in are
complete by construction and its amounts are durations, sizes and 1s, so it binds them once
(`web/metrics.Increments`, `Observers`, `requestmetrics`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from prometheus_client import Counter, Histogram


def fast_inc(child: Counter) -> Callable[[float], None]:
    """A counter child's increment without `Counter.inc`'s checks (labels complete, amount not
    negative): for the request path, whose children are complete and whose amounts are 1. The
    value object is the one `Counter.inc` updates, so what Prometheus scrapes is the same."""
    inc: Callable[[float], None] = child._value.inc
    return inc


class FastHistogram:
    """A histogram child's `observe`, as prometheus_client computes it (the sum, then the first
    bucket whose bound is at least the amount) with one bisection instead of its loop over the
    bounds and its per-call checks: the request path observes three or four histograms a request.
    The value objects are the child's own, so what Prometheus scrapes is the same."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._sum: Callable[[float], None] = child._sum.inc
        self._buckets: list[Callable[[float], None]] = [bucket.inc for bucket in child._buckets]
        self._bounds: list[float] = list(child._upper_bounds)  # the last is +Inf

    def observe(self, amount: float) -> None:
        self._sum(amount)
        self._buckets[bisect_left(self._bounds, amount)](1)
