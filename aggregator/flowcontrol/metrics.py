"""`apiserver_flowcontrol_*`: k8s.io/apiserver's `pkg/util/flowcontrol/metrics/metrics.go`, names,
labels and buckets as upstream.

Every request moves several of these (in queue, executing, seats, the wait and execution
histograms, the timing histograms), so they are kept as plain numbers where the request path
changes them and turned into Prometheus families only when `/metrics` is scraped (one collector):
a `prometheus_client` child costs a lock and a few calls per change, which the request path cannot
afford several times over. Series, once there, stay (upstream's vectors keep their children).

The four timing histograms (`priority_level_seat_utilization`, `priority_level_request_utilization`,
`read_vs_write_current_requests`, `demand_seats`) are component-base's `TimingRatioHistogram`: each
bucket accumulates the seconds the ratio spent in it, and `_count` is the seconds observed.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from aggregator.web.requestmetrics import InflightWatermark

PREFIX = "apiserver_flowcontrol_"
QUEUE_LENGTH_BUCKETS = (0.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)
DURATION_BUCKETS = (0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0)
WATCH_COUNT_BUCKETS = (0.0, 1.0, 10.0, 100.0, 1000.0, 10000.0)
WORK_SEATS_BUCKETS = (1.0, 2.0, 4.0, 10.0)
SEAT_UTILIZATION_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
REQUEST_UTILIZATION_BUCKETS = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.25, 0.5, 0.75, 1.0)
READ_VS_WRITE_BUCKETS = (0.0, 0.001, 0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
DEMAND_BUCKETS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.8, 4.0, 6.0)
WAITING, EXECUTING = "waiting", "executing"
READ_ONLY, MUTATING = "readOnly", "mutating"


class Histogram:
    """A histogram kept as bucket counts (`le` semantics: a value lands in the first bucket >= it)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        buckets, running = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append((_le(bound), running))
        return buckets, running


def _le(bound: float) -> str:
    if bound == math.inf:
        return "+Inf"
    return repr(float(bound))


class TimingRatio:
    """component-base's `TimingRatioHistogram`: `numerator / denominator`, observed at the end of every
    instant, so each bucket holds the seconds the ratio spent there."""

    __slots__ = ("_bucket", "_since", "bounds", "counts", "denominator", "numerator", "total")

    def __init__(self, bounds: tuple[float, ...], numerator: float, denominator: float, now: float) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0  # the integral of the ratio over time (`_sum`)
        self.numerator = numerator
        self.denominator = denominator
        self._since = now
        self._bucket = self._bucket_of()

    def _bucket_of(self) -> int:
        return bisect_left(self.bounds, self.ratio)

    @property
    def ratio(self) -> float:
        d = self.denominator
        if d == 0:
            return math.nan if self.numerator == 0 else math.copysign(math.inf, self.numerator)
        return self.numerator / d

    def _advance(self, now: float) -> None:
        elapsed = now - self._since
        if elapsed > 0:
            self.counts[self._bucket] += elapsed
            ratio = self.ratio
            if ratio == ratio:  # not NaN
                self.total += ratio * elapsed
            self._since = now

    def add(self, delta: float, now: float) -> None:
        self._advance(now)
        self.numerator += delta
        self._bucket = self._bucket_of()

    def set(self, numerator: float, now: float) -> None:
        self._advance(now)
        self.numerator = numerator
        self._bucket = self._bucket_of()

    def set_denominator(self, denominator: float, now: float) -> None:
        self._advance(now)
        self.denominator = denominator
        self._bucket = self._bucket_of()

    def cumulative(self, now: float) -> tuple[list[tuple[str, float]], float, float]:
        self._advance(now)
        buckets, running = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append((_le(bound), running))
        return buckets, running, self.total


class LevelMetrics:
    """One priority level's figures, by FlowSchema where upstream labels them so."""

    __slots__ = (
        "adjustment",
        "demand",
        "dispatch_no_accommodation",
        "dispatch_r",
        "dispatched",
        "executing_requests",
        "executing_seats",
        "execution",
        "inqueue_requests",
        "inqueue_seats",
        "latest_s",
        "limits",
        "name",
        "next_discounted_s",
        "next_s",
        "queue_length",
        "r",
        "rejected",
        "request_executing",
        "request_waiting",
        "seat_utilization",
        "wait",
        "watch_count",
        "work_seats",
    )

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.inqueue_requests: dict[str, int] = {}
        self.inqueue_seats: dict[str, int] = {}
        self.executing_requests: dict[str, int] = {}
        self.executing_seats: dict[str, int] = {}
        self.dispatched: dict[str, int] = {}
        self.rejected: dict[tuple[str, str], int] = {}
        self.dispatch_no_accommodation: dict[str, int] = {}
        self.queue_length: dict[str, Histogram] = {}
        self.wait: dict[tuple[str, str], Histogram] = {}
        self.execution: dict[tuple[str, str], Histogram] = {}
        self.work_seats: dict[str, Histogram] = {}
        self.watch_count: dict[str, Histogram] = {}
        self.r: float | None = None
        self.dispatch_r: float | None = None
        self.latest_s = 0.0
        self.next_s: tuple[float, float] | None = None
        self.next_discounted_s: tuple[float, float] = (0.0, 0.0)
        # (nominal, lower, upper) seats; the last adjustment's (hwm, avg, stdev, smoothed, target, current).
        self.limits: tuple[int, int, int] | None = None
        self.adjustment: tuple[float, float, float, float, float, int] | None = None
        self.seat_utilization = TimingRatio(SEAT_UTILIZATION_BUCKETS, 0, 1, now)
        self.request_waiting = TimingRatio(REQUEST_UTILIZATION_BUCKETS, 0, 1, now)
        self.request_executing = TimingRatio(REQUEST_UTILIZATION_BUCKETS, 0, 1, now)
        self.demand = TimingRatio(DEMAND_BUCKETS, 0, 1, now)

    def observe(self, table: dict[Any, Histogram], key: Any, bounds: tuple[float, ...], value: float) -> None:
        histogram = table.get(key)
        if histogram is None:
            histogram = table[key] = Histogram(bounds)
        histogram.observe(value)


class FlowControlMetrics:
    """The families of every level, registered once in the gateway's registry."""

    def __init__(self, registry: CollectorRegistry | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.levels: dict[str, LevelMetrics] = {}
        self.fair_frac = 0.0
        now = clock()
        self.read_vs_write = {
            (phase, kind): TimingRatio(READ_VS_WRITE_BUCKETS, 0, 1, now)
            for phase in (WAITING, EXECUTING)
            for kind in (READ_ONLY, MUTATING)
        }
        # apiserver_current_inqueue_requests: APF's waiting-phase watermark.
        self.waiting = WaitingWatermark(clock)
        if registry is not None:
            registry.register(self)
            registry.register(self.waiting)

    def level(self, name: str) -> LevelMetrics:
        metrics = self.levels.get(name)
        if metrics is None:
            metrics = self.levels[name] = LevelMetrics(name, self.clock())
        return metrics

    def describe(self) -> list[Metric]:
        return []

    # --- exposition ------------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        levels = [self.levels[name] for name in sorted(self.levels)]
        yield from self._counters(levels)
        yield from self._gauges(levels)
        yield from self._histograms(levels)
        yield from self._timing(levels, now)

    @staticmethod
    def _counters(levels: list[LevelMetrics]) -> Iterator[Metric]:
        rejected = CounterMetricFamily(
            PREFIX + "rejected_requests",
            "Number of requests rejected by API Priority and Fairness subsystem",
            labels=["priority_level", "flow_schema", "reason"],
        )
        dispatched = CounterMetricFamily(
            PREFIX + "dispatched_requests",
            "Number of requests executed by API Priority and Fairness subsystem",
            labels=["priority_level", "flow_schema"],
        )
        no_room = CounterMetricFamily(
            PREFIX + "request_dispatch_no_accommodation",
            "Number of times a dispatch attempt resulted in a non accommodation due to lack of available seats",
            labels=["priority_level", "flow_schema"],
        )
        epochs = CounterMetricFamily(
            PREFIX + "epoch_advance",
            "Number of times the queueset's progress meter jumped backward",
            labels=["priority_level", "success"],
        )
        for m in levels:
            for (fs, reason), n in m.rejected.items():
                rejected.add_metric([m.name, fs, reason], n)
            for fs, n in m.dispatched.items():
                dispatched.add_metric([m.name, fs], n)
            for fs, n in m.dispatch_no_accommodation.items():
                no_room.add_metric([m.name, fs], n)
        yield from (rejected, dispatched, no_room, epochs)

    def _gauges(self, levels: list[LevelMetrics]) -> Iterator[Metric]:
        by_fs = ["priority_level", "flow_schema"]
        per_fs = {
            "current_inqueue_requests": (
                "Number of requests currently pending in queues of the API Priority and Fairness subsystem",
                "inqueue_requests",
            ),
            "current_inqueue_seats": (
                "Number of seats currently pending in queues of the API Priority and Fairness subsystem",
                "inqueue_seats",
            ),
            "current_executing_requests": (
                "Number of requests in initial (for a WATCH) or any (for a non-WATCH) execution stage in the "
                "API Priority and Fairness subsystem",
                "executing_requests",
            ),
            "current_executing_seats": (
                "Concurrency (number of seats) occupied by the currently executing (initial stage for a WATCH, "
                "any stage otherwise) requests in the API Priority and Fairness subsystem",
                "executing_seats",
            ),
            "request_concurrency_in_use": (
                "(Deprecated since 1.31.0) Concurrency (number of seats) occupied by the currently executing "
                "(initial stage for a WATCH, any stage otherwise) requests in the API Priority and Fairness subsystem",
                "executing_seats",
            ),
        }
        for name, (help_text, attribute) in per_fs.items():
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=by_fs)
            for m in levels:
                for fs, value in getattr(m, attribute).items():
                    family.add_metric([m.name, fs], value)
            yield family
        per_level: dict[str, tuple[str, Callable[[LevelMetrics], float | None]]] = {
            "current_r": ("R(time of last change)", lambda m: m.r),
            "dispatch_r": ("R(time of last dispatch)", lambda m: m.dispatch_r),
            "latest_s": ("S(most recently dispatched request)", lambda m: m.latest_s if m.dispatch_r is not None else None),
            "request_concurrency_limit": (
                "(Deprecated since 1.30.0) Nominal number of execution seats configured for each priority level",
                lambda m: m.limits[0] if m.limits else None,
            ),
            "nominal_limit_seats": (
                "Nominal number of execution seats configured for each priority level",
                lambda m: m.limits[0] if m.limits else None,
            ),
            "lower_limit_seats": (
                "Configured lower bound on number of execution seats available to each priority level",
                lambda m: m.limits[1] if m.limits else None,
            ),
            "upper_limit_seats": (
                "Configured upper bound on number of execution seats available to each priority level",
                lambda m: m.limits[2] if m.limits else None,
            ),
            "demand_seats_high_watermark": (
                "High watermark, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[0] if m.adjustment else None,
            ),
            "demand_seats_average": (
                "Time-weighted average, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[1] if m.adjustment else None,
            ),
            "demand_seats_stdev": (
                "Time-weighted standard deviation, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[2] if m.adjustment else None,
            ),
            "demand_seats_smoothed": ("Smoothed seat demands", lambda m: m.adjustment[3] if m.adjustment else None),
            "target_seats": ("Seat allocation targets", lambda m: m.adjustment[4] if m.adjustment else None),
            "current_limit_seats": (
                "current derived number of execution seats available to each priority level",
                lambda m: m.adjustment[5] if m.adjustment else None,
            ),
        }
        for name, (help_text, read) in per_level.items():
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=["priority_level"])
            for m in levels:
                value = read(m)
                if value is not None:
                    family.add_metric([m.name], value)
            yield family
        for name, help_text, attribute in (
            ("next_s_bounds", "min and max, over queues, of S(oldest waiting request in queue)", "next_s"),
            (
                "next_discounted_s_bounds",
                "min and max, over queues, of S(oldest waiting request in queue) - estimated work in progress",
                "next_discounted_s",
            ),
        ):
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=["priority_level", "bound"])
            for m in levels:
                bounds = getattr(m, attribute)
                if m.next_s is not None:
                    family.add_metric([m.name, "min"], bounds[0])
                    family.add_metric([m.name, "max"], bounds[1])
            yield family
        frac = GaugeMetricFamily(
            PREFIX + "seat_fair_frac",
            "Fair fraction of server's concurrency to allocate to each priority level that can use it",
        )
        frac.add_metric([], self.fair_frac)
        yield frac

    @staticmethod
    def _histograms(levels: list[LevelMetrics]) -> Iterator[Metric]:
        specs: list[tuple[str, str, list[str], str]] = [
            (
                "request_queue_length_after_enqueue",
                "Length of queue in the API Priority and Fairness subsystem, as seen by each request after it is enqueued",
                ["flow_schema"],
                "queue_length",
            ),
            (
                "request_wait_duration_seconds",
                "Length of time a request spent waiting in its queue",
                ["flow_schema", "execute"],
                "wait",
            ),
            (
                "request_execution_seconds",
                "Duration of initial stage (for a WATCH) or any (for a non-WATCH) stage of request execution in "
                "the API Priority and Fairness subsystem",
                ["flow_schema", "type"],
                "execution",
            ),
            ("watch_count_samples", "count of watchers for mutating requests in API Priority and Fairness", ["flow_schema"], "watch_count"),
            (
                "work_estimated_seats",
                "Number of estimated seats (maximum of initial and final seats) associated with requests in API "
                "Priority and Fairness",
                ["flow_schema"],
                "work_seats",
            ),
        ]
        for name, help_text, labels, attribute in specs:
            family = HistogramMetricFamily(PREFIX + name, help_text, labels=["priority_level", *labels])
            for m in levels:
                for key, histogram in getattr(m, attribute).items():
                    values = list(key) if isinstance(key, tuple) else [key]
                    buckets, _count = histogram.cumulative()
                    family.add_metric([m.name, *values], buckets, histogram.total)
            yield family

    def _timing(self, levels: list[LevelMetrics], now: float) -> Iterator[Metric]:
        seats = HistogramMetricFamily(
            PREFIX + "priority_level_seat_utilization",
            "Observations, at the end of every nanosecond, of utilization of seats for any stage of execution "
            "(but only initial stage for WATCHes)",
            labels=["phase", "priority_level"],
        )
        requests = HistogramMetricFamily(
            PREFIX + "priority_level_request_utilization",
            "Observations, at the end of every nanosecond, of number of requests (as a fraction of the relevant "
            "limit) waiting or in any stage of execution (but only initial stage for WATCHes)",
            labels=["phase", "priority_level"],
        )
        demand = HistogramMetricFamily(
            PREFIX + "demand_seats",
            "Observations, at the end of every nanosecond, of (the number of seats each priority level could "
            "use) / (nominal number of seats for that level)",
            labels=["priority_level"],
        )
        for m in levels:
            buckets, _count, total = m.seat_utilization.cumulative(now)
            seats.add_metric([EXECUTING, m.name], buckets, total)
            for phase, ratio in ((WAITING, m.request_waiting), (EXECUTING, m.request_executing)):
                buckets, _count, total = ratio.cumulative(now)
                requests.add_metric([phase, m.name], buckets, total)
            buckets, _count, total = m.demand.cumulative(now)
            demand.add_metric([m.name], buckets, total)
        read_vs_write = HistogramMetricFamily(
            PREFIX + "read_vs_write_current_requests",
            "Observations, at the end of every nanosecond, of the number of requests (as a fraction of the "
            "relevant limit) waiting or in regular stage of execution",
            labels=["phase", "request_kind"],
        )
        for (phase, kind), ratio in self.read_vs_write.items():
            buckets, _count, total = ratio.cumulative(now)
            read_vs_write.add_metric([phase, kind], buckets, total)
        yield from (seats, requests, demand, read_vs_write)


class WaitingWatermark(InflightWatermark):
    """`apiserver_current_inqueue_requests{request_kind}`: the most requests of each kind waiting in
    APF's queues at once during the last completed second (the filter's `waitingMark`)."""

    HELP = "[ALPHA] Maximal number of queued requests in this apiserver per request kind in last second."

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            renamed = GaugeMetricFamily("apiserver_current_inqueue_requests", self.HELP, labels=["request_kind"])
            for sample in family.samples:
                renamed.add_metric([sample.labels["request_kind"]], sample.value)
            yield renamed
