"""`apiserver_flowcontrol_*`: k8s.io/apiserver's `pkg/util/flowcontrol/metrics/metrics.go`, names,
labels and buckets as upstream.

Every request moves several of these (in queue, executing, seats, the wait and execution
histograms, the timing histograms), so they are kept as plain numbers where the request path
changes them and turned into Prometheus families only when `/metrics` is scraped (one collector):
a `prometheus_client` child costs a lock and a few calls per change, which the request path cannot
afford several times over. Series, once there, stay (upstream's vectors keep their children).

The four timing histograms (`priority_level_seat_utilization`, `priority_level_request_utilization`,
`read_vs_write_current_requests`, `demand_seats`) are component-base's `TimingRatioHistogram`: each
bucket accumulates the nanoseconds the ratio spent in it, and `_count` is the nanoseconds observed.
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
SS_SCALE = 100_000_000  # the queueset's fixed point: 1e-8 seat-seconds (upstream's SeatSeconds)
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

    def cumulative(self, index: int = 0, extra: float = 0.0) -> tuple[list[tuple[str, float]], float]:
        """Cumulative buckets, with `extra` more observations counted in bucket `index` (a request
        path's plain counter of one frequent value)."""
        buckets, running = [], 0.0
        for i, (bound, count) in enumerate(zip((*self.bounds, math.inf), self.counts, strict=True)):
            running += count + (extra if i == index else 0.0)
            buckets.append((_le(bound), running))
        return buckets, running


def _le(bound: float) -> str:
    if bound == math.inf:
        return "+Inf"
    return repr(float(bound))


class TimingRatio:
    """component-base's `TimingRatioHistogram`: `value / denominator` observed at the end of every
    nanosecond, so each bucket holds the nanoseconds the ratio spent there (filled from a
    `StateClock`'s times when scraped or when the denominator changes)."""

    __slots__ = ("bounds", "counts", "denominator", "total")

    def __init__(self, bounds: tuple[float, ...], denominator: float = 1.0) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0  # the integral of the ratio over the nanoseconds observed (`_sum`)
        self.denominator = denominator

    def absorb(self, value: float, nanoseconds: float) -> None:
        d = self.denominator
        ratio = (math.nan if value == 0 else math.copysign(math.inf, value)) if d == 0 else value / d
        self.counts[bisect_left(self.bounds, ratio) if ratio == ratio else len(self.bounds)] += nanoseconds
        if ratio == ratio and not math.isinf(ratio):
            self.total += ratio * nanoseconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        buckets, running = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append((_le(bound), running))
        return buckets, self.total


# A level's state (requests waiting, requests executing, seats in use, seat demand), as a `StateClock`
# keys it: the commonest state, nothing waiting and every executing request holding one seat
# (w = 0, e = s = d), is the number of seats itself (a small int: the cheapest key there is).
LevelState = int | tuple[int, int, int, int]


def level_state(waiting: int, executing: int, seats: int, demand: int) -> LevelState:
    if waiting == 0 and executing == seats == demand:
        return seats
    return (waiting, executing, seats, demand)


def _unfold(state: LevelState) -> tuple[int, int, int, int]:
    return (0, state, state, state) if isinstance(state, int) else state


class StateClock:
    """How long a level spent in each state (`level_state`): one dictionary update per change on the
    request path, turned into timing histograms only when they are read."""

    __slots__ = ("since", "state", "times")

    def __init__(self, now: float) -> None:
        self.since = now
        self.state: LevelState = 0
        self.times: dict[LevelState, float] = {}

    def note(self, now: float, state: LevelState) -> None:
        elapsed = now - self.since
        if elapsed > 0:
            times = self.times
            previous = self.state
            times[previous] = times.get(previous, 0.0) + elapsed
            self.since = now
        self.state = state

    def drain(self, now: float) -> dict[tuple[int, int, int, int], float]:
        """The seconds in each state up to `now`, forgotten once returned."""
        self.note(now, self.state)
        times, self.times = self.times, {}
        found: dict[tuple[int, int, int, int], float] = {}
        for state, seconds in times.items():
            key = _unfold(state)
            found[key] = found.get(key, 0.0) + seconds
        return found


class Occupancy:
    """How long one counter spent at each of its values (a list indexed by the value: the request
    path's cheapest update), for a timing histogram."""

    __slots__ = ("since", "times", "value")

    def __init__(self, now: float) -> None:
        self.since = now
        self.value = 0
        self.times = [0.0] * 256

    def move(self, now: float, delta: int) -> None:
        value = self.value
        self.grow(value)
        self.times[value] += now - self.since
        self.since = now
        self.value = value + delta

    def grow(self, value: int) -> None:
        times = self.times
        if value >= len(times):
            times.extend([0.0] * (value + 1 - len(times)))

    def drain(self, now: float) -> list[tuple[int, float]]:
        """The seconds at each value up to `now`, forgotten once returned."""
        self.move(now, 0)
        times = self.times
        found = [(value, seconds) for value, seconds in enumerate(times) if seconds]
        self.times = [0.0] * len(times)
        return found


class FlowStats:
    """One (priority level, FlowSchema)'s series. The request path moves plain counters; the most
    frequent observations are counted, not observed (`one_seat`: a seat estimated; `waited_none`:
    dispatched as it arrived; `passed`: a queue's length after enqueue, 1), and folded into their
    histograms when scraped. `fast` counts the commonest request of all at once (one seat,
    dispatched as it arrived through its queue: dispatched, one seat, waited 0 s, passed a queue),
    `fast_exempt` the same at an exempt level (dispatched, one seat)."""

    __slots__ = (
        "dispatched",
        "executed",
        "executing_requests",
        "executing_seats",
        "executions",
        "fast",
        "fast_exempt",
        "inqueue_requests",
        "inqueue_seats",
        "no_accommodation",
        "one_seat",
        "passed",
        "queue_length",
        "queued",
        "regular",
        "rejected",
        "wait",
        "waited_none",
        "watch_count",
        "work_seats",
    )

    def __init__(self) -> None:
        self.inqueue_requests = self.inqueue_seats = 0
        self.executing_requests = self.executing_seats = 0
        self.dispatched = self.no_accommodation = 0
        self.one_seat = self.waited_none = self.passed = 0
        self.fast = self.fast_exempt = 0
        self.queued = self.executed = False  # the series upstream creates at the first enqueue, dispatch
        self.rejected: dict[str, int] = {}
        self.work_seats = Histogram(WORK_SEATS_BUCKETS)
        self.queue_length = Histogram(QUEUE_LENGTH_BUCKETS)
        self.watch_count = Histogram(WATCH_COUNT_BUCKETS)
        self.wait: dict[str, Histogram] = {}  # execute ("true"/"false") -> histogram
        self.executions: dict[str, Histogram] = {}  # type ("watch") -> histogram
        self.regular = Histogram(DURATION_BUCKETS)  # type "regular" (shown once observed)

    def waited(self, execute: str) -> Histogram:
        histogram = self.wait.get(execute)
        if histogram is None:
            histogram = self.wait[execute] = Histogram(DURATION_BUCKETS)
        return histogram

    def execution(self, kind: str) -> Histogram:
        if kind == "regular":
            return self.regular
        histogram = self.executions.get(kind)
        if histogram is None:
            histogram = self.executions[kind] = Histogram(DURATION_BUCKETS)
        return histogram

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    # what the counters add up to, with the fast ones folded in
    @property
    def all_dispatched(self) -> int:
        return self.dispatched + self.fast + self.fast_exempt

    @property
    def shown_executing(self) -> bool:
        return self.executed or self.fast > 0 or self.fast_exempt > 0

    @property
    def shown_inqueue(self) -> bool:
        return self.queued or self.fast > 0

    def all_executions(self) -> dict[str, Histogram]:
        found = dict(self.executions)
        if self.regular.total or any(self.regular.counts):
            found["regular"] = self.regular
        return found


class LevelMetrics:
    """One priority level's figures, by FlowSchema where upstream labels them so."""

    __slots__ = (
        "adjustment",
        "demand",
        "demand_max",
        "demand_min",
        "dispatch",
        "flows",
        "limits",
        "name",
        "period",
        "queues",
        "request_executing",
        "request_waiting",
        "seat_utilization",
        "state",
    )

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.flows: dict[str, FlowStats] = {}  # by FlowSchema name
        # Virtual time in the queueset's fixed point (1e-8 seat-seconds): R at the last change (the
        # queueset's own), and at the last dispatch (R, S, min S, max S, min discounted S, max
        # discounted S).
        self.queues: Any = None
        self.dispatch: tuple[int, int, int, int, int, int] | None = None
        # The seat demand over the adjustment period: its integrals (from `state`), and its extremes
        # as the queueset saw them change.
        self.period = [0.0, 0.0, 0.0]  # seconds, the integral of demand, of demand squared
        self.demand_min = 0
        self.demand_max = 0
        # (nominal, lower, upper) seats; the last adjustment's (hwm, avg, stdev, smoothed, target, current).
        self.limits: tuple[int, int, int] | None = None
        self.adjustment: tuple[float, float, float, float, float, int] | None = None
        self.seat_utilization = TimingRatio(SEAT_UTILIZATION_BUCKETS)
        self.request_waiting = TimingRatio(REQUEST_UTILIZATION_BUCKETS)
        self.request_executing = TimingRatio(REQUEST_UTILIZATION_BUCKETS)
        self.demand = TimingRatio(DEMAND_BUCKETS)
        # (requests waiting, requests executing, seats in use, seat demand) over time.
        self.state = StateClock(now)

    @property
    def r(self) -> int | None:
        """R at the last change (`SetCurrentR` as each `syncTimeLocked` ends)."""
        return self.queues.current_r if self.queues is not None else None

    def flush(self, now: float) -> None:
        """The time spent in each state since the last flush, into the timing histograms and the seat
        demand's integrals."""
        period = self.period
        for (waiting, executing, seats, demand), seconds in self.state.drain(now).items():
            nanoseconds = seconds * 1e9
            self.request_waiting.absorb(waiting, nanoseconds)
            self.request_executing.absorb(executing, nanoseconds)
            self.seat_utilization.absorb(seats, nanoseconds)
            self.demand.absorb(demand, nanoseconds)
            period[0] += seconds
            period[1] += demand * seconds
            period[2] += demand * demand * seconds

    def take_demand(self, now: float) -> tuple[float, float, float, float, float]:
        """The seat demand since the last call (`Integrator.Reset`): (seconds, integral, integral of
        the square, min, max); the next period starts at the current demand."""
        self.flush(now)
        seconds, integral, squares = self.period
        low, high = self.demand_min, self.demand_max
        self.period = [0.0, 0.0, 0.0]
        current = _unfold(self.state.state)[3]
        self.demand_min = self.demand_max = current
        return seconds, integral, squares, float(low), float(high)

    def set_denominators(
        self, now: float, *, waiting: float | None = None, executing: float | None = None, demand: float | None = None
    ) -> None:
        """New denominators apply from now on (`SetDenominator`)."""
        self.flush(now)
        if waiting is not None:
            self.request_waiting.denominator = waiting
        if executing is not None:
            self.request_executing.denominator = executing
            self.seat_utilization.denominator = executing
        if demand is not None:
            self.demand.denominator = demand

    def flow(self, fs_name: str) -> FlowStats:
        """The series of the FlowSchema `fs_name` in this level (made on first use)."""
        stats = self.flows.get(fs_name)
        if stats is None:
            stats = self.flows[fs_name] = FlowStats()
        return stats


class FlowControlMetrics:
    """The families of every level, registered once in the gateway's registry."""

    def __init__(self, registry: CollectorRegistry | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.levels: dict[str, LevelMetrics] = {}
        self.fair_frac = 0.0
        now = clock()
        self.read_vs_write = {
            (phase, kind): TimingRatio(READ_VS_WRITE_BUCKETS) for phase in (WAITING, EXECUTING) for kind in (READ_ONLY, MUTATING)
        }
        # Requests waiting and executing, by kind, over time.
        self.read_vs_write_counts = {key: Occupancy(now) for key in self.read_vs_write}
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

    def flush_read_vs_write(self, now: float) -> None:
        for key, counts in self.read_vs_write_counts.items():
            ratio = self.read_vs_write[key]
            for value, seconds in counts.drain(now):
                ratio.absorb(value, seconds * 1e9)

    def set_read_vs_write_denominators(self, waiting: float, executing: float) -> None:
        """`maxWaitingRequests` and `maxExecutingRequests` of a new configuration."""
        self.flush_read_vs_write(self.clock())
        for (phase, _kind), ratio in self.read_vs_write.items():
            ratio.denominator = waiting if phase == WAITING else executing

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
            "[BETA] Number of requests rejected by API Priority and Fairness subsystem",
            labels=["priority_level", "flow_schema", "reason"],
        )
        dispatched = CounterMetricFamily(
            PREFIX + "dispatched_requests",
            "[BETA] Number of requests executed by API Priority and Fairness subsystem",
            labels=["priority_level", "flow_schema"],
        )
        no_room = CounterMetricFamily(
            PREFIX + "request_dispatch_no_accommodation",
            "[ALPHA] Number of times a dispatch attempt resulted in a non accommodation due to lack of available seats",
            labels=["priority_level", "flow_schema"],
        )
        epochs = CounterMetricFamily(
            PREFIX + "epoch_advance",
            "[ALPHA] Number of times the queueset's progress meter jumped backward",
            labels=["priority_level", "success"],
        )
        for m in levels:
            for fs, stats in sorted(m.flows.items()):
                for reason, n in stats.rejected.items():
                    rejected.add_metric([m.name, fs, reason], n)
                if stats.shown_executing:
                    dispatched.add_metric([m.name, fs], stats.all_dispatched)
                if stats.no_accommodation:
                    no_room.add_metric([m.name, fs], stats.no_accommodation)
        yield from (rejected, dispatched, no_room, epochs)

    def _gauges(self, levels: list[LevelMetrics]) -> Iterator[Metric]:
        by_fs = ["priority_level", "flow_schema"]
        per_fs = {
            "current_inqueue_requests": (
                "[BETA] Number of requests currently pending in queues of the API Priority and Fairness subsystem",
                "inqueue_requests",
                "shown_inqueue",
            ),
            "current_inqueue_seats": (
                "[ALPHA] Number of seats currently pending in queues of the API Priority and Fairness subsystem",
                "inqueue_seats",
                "shown_inqueue",
            ),
            "current_executing_requests": (
                "[BETA] Number of requests in initial (for a WATCH) or any (for a non-WATCH) execution stage in the "
                "API Priority and Fairness subsystem",
                "executing_requests",
                "shown_executing",
            ),
            "current_executing_seats": (
                "[BETA] Concurrency (number of seats) occupied by the currently executing (initial stage for a WATCH, "
                "any stage otherwise) requests in the API Priority and Fairness subsystem",
                "executing_seats",
                "shown_executing",
            ),
            "request_concurrency_in_use": (
                "[ALPHA] Concurrency (number of seats) occupied by the currently executing "
                "(initial stage for a WATCH, any stage otherwise) requests in the API Priority and Fairness subsystem",
                "executing_seats",
                "shown_executing",
            ),
        }
        for name, (help_text, attribute, shown) in per_fs.items():
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=by_fs)
            for m in levels:
                for fs, stats in sorted(m.flows.items()):
                    if getattr(stats, shown):
                        family.add_metric([m.name, fs], getattr(stats, attribute))
            yield family
        per_level: dict[str, tuple[str, Callable[[LevelMetrics], float | None]]] = {
            "current_r": ("[ALPHA] R(time of last change)", lambda m: m.r / SS_SCALE if m.r is not None else None),
            "dispatch_r": ("[ALPHA] R(time of last dispatch)", lambda m: _dispatch(m, 0)),
            "latest_s": ("[ALPHA] S(most recently dispatched request)", lambda m: _dispatch(m, 1)),
            "request_concurrency_limit": (
                "[ALPHA] Nominal number of execution seats configured for each priority level",
                lambda m: m.limits[0] if m.limits else None,
            ),
            "nominal_limit_seats": (
                "[BETA] Nominal number of execution seats configured for each priority level",
                lambda m: m.limits[0] if m.limits else None,
            ),
            "lower_limit_seats": (
                "[ALPHA] Configured lower bound on number of execution seats available to each priority level",
                lambda m: m.limits[1] if m.limits else None,
            ),
            "upper_limit_seats": (
                "[ALPHA] Configured upper bound on number of execution seats available to each priority level",
                lambda m: m.limits[2] if m.limits else None,
            ),
            "demand_seats_high_watermark": (
                "[ALPHA] High watermark, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[0] if m.adjustment else None,
            ),
            "demand_seats_average": (
                "[ALPHA] Time-weighted average, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[1] if m.adjustment else None,
            ),
            "demand_seats_stdev": (
                "[ALPHA] Time-weighted standard deviation, over last adjustment period, of demand_seats",
                lambda m: m.adjustment[2] if m.adjustment else None,
            ),
            "demand_seats_smoothed": ("[ALPHA] Smoothed seat demands", lambda m: m.adjustment[3] if m.adjustment else None),
            "target_seats": ("[ALPHA] Seat allocation targets", lambda m: m.adjustment[4] if m.adjustment else None),
            "current_limit_seats": (
                "[ALPHA] current derived number of execution seats available to each priority level",
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
        for name, help_text, first in (
            ("next_s_bounds", "[ALPHA] min and max, over queues, of S(oldest waiting request in queue)", 2),
            (
                "next_discounted_s_bounds",
                "[ALPHA] min and max, over queues, of S(oldest waiting request in queue) - estimated work in progress",
                4,
            ),
        ):
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=["priority_level", "bound"])
            for m in levels:
                if m.dispatch is not None:
                    family.add_metric([m.name, "min"], m.dispatch[first] / SS_SCALE)
                    family.add_metric([m.name, "max"], m.dispatch[first + 1] / SS_SCALE)
            yield family
        frac = GaugeMetricFamily(
            PREFIX + "seat_fair_frac",
            "[ALPHA] Fair fraction of server's concurrency to allocate to each priority level that can use it",
        )
        frac.add_metric([], self.fair_frac)
        yield frac

    @staticmethod
    def _histograms(levels: list[LevelMetrics]) -> Iterator[Metric]:
        def family(name: str, help_text: str, *labels: str) -> HistogramMetricFamily:
            return HistogramMetricFamily(PREFIX + name, help_text, labels=["priority_level", "flow_schema", *labels])

        queue_length = family(
            "request_queue_length_after_enqueue",
            "[ALPHA] Length of queue in the API Priority and Fairness subsystem, as seen by each request after it is enqueued",
        )
        wait = family("request_wait_duration_seconds", "[BETA] Length of time a request spent waiting in its queue", "execute")
        execution = family(
            "request_execution_seconds",
            "[ALPHA] Duration of initial stage (for a WATCH) or any (for a non-WATCH) stage of request execution in "
            "the API Priority and Fairness subsystem",
            "type",
        )
        watch_count = family(
            "watch_count_samples", "[ALPHA] count of watchers for mutating requests in API Priority and Fairness"
        )
        work_seats = family(
            "work_estimated_seats",
            "[ALPHA] Number of estimated seats (maximum of initial and final seats) associated with requests in API "
            "Priority and Fairness",
        )
        for m in levels:
            for fs, stats in sorted(m.flows.items()):
                labels = [m.name, fs]
                # the counted observations: a queue length of 1 (bucket le=10), a wait of 0 s (le=0),
                # one seat (le=1)
                passed = stats.passed + stats.fast
                buckets, count = stats.queue_length.cumulative(1, passed)
                if count:
                    queue_length.add_metric(labels, buckets, stats.queue_length.total + passed)
                waited = stats.wait.get("true")
                waited_none = stats.waited_none + stats.fast
                if waited is not None or waited_none:
                    histogram = waited or Histogram(DURATION_BUCKETS)
                    buckets, _count = histogram.cumulative(0, waited_none)
                    wait.add_metric([*labels, "true"], buckets, histogram.total)
                refused = stats.wait.get("false")
                if refused is not None:
                    buckets, _count = refused.cumulative()
                    wait.add_metric([*labels, "false"], buckets, refused.total)
                for kind, histogram in sorted(stats.all_executions().items()):
                    buckets, _count = histogram.cumulative()
                    execution.add_metric([*labels, kind], buckets, histogram.total)
                buckets, count = stats.watch_count.cumulative()
                if count:
                    watch_count.add_metric(labels, buckets, stats.watch_count.total)
                one_seat = stats.one_seat + stats.fast + stats.fast_exempt
                buckets, count = stats.work_seats.cumulative(0, one_seat)
                if count:
                    work_seats.add_metric(labels, buckets, stats.work_seats.total + one_seat)
        yield from (queue_length, wait, execution, watch_count, work_seats)

    def _timing(self, levels: list[LevelMetrics], now: float) -> Iterator[Metric]:
        seats = HistogramMetricFamily(
            PREFIX + "priority_level_seat_utilization",
            "EXPERIMENTAL: [ALPHA] Observations, at the end of every nanosecond, of utilization of seats for any stage of execution "
            "(but only initial stage for WATCHes)",
            labels=["phase", "priority_level"],
        )
        requests = HistogramMetricFamily(
            PREFIX + "priority_level_request_utilization",
            "EXPERIMENTAL: [ALPHA] Observations, at the end of every nanosecond, of number of requests (as a fraction of the relevant "
            "limit) waiting or in any stage of execution (but only initial stage for WATCHes)",
            labels=["phase", "priority_level"],
        )
        demand = HistogramMetricFamily(
            PREFIX + "demand_seats",
            "EXPERIMENTAL: [ALPHA] Observations, at the end of every nanosecond, of (the number of seats each priority level could "
            "use) / (nominal number of seats for that level)",
            labels=["priority_level"],
        )
        for m in levels:
            m.flush(now)
            buckets, total = m.seat_utilization.cumulative()
            seats.add_metric([EXECUTING, m.name], buckets, total)
            for phase, ratio in ((WAITING, m.request_waiting), (EXECUTING, m.request_executing)):
                buckets, total = ratio.cumulative()
                requests.add_metric([phase, m.name], buckets, total)
            buckets, total = m.demand.cumulative()
            demand.add_metric([m.name], buckets, total)
        read_vs_write = HistogramMetricFamily(
            PREFIX + "read_vs_write_current_requests",
            "EXPERIMENTAL: [ALPHA] Observations, at the end of every nanosecond, of the number of requests (as a "
            "fraction of the relevant limit) waiting or in regular stage of execution",
            labels=["phase", "request_kind"],
        )
        self.flush_read_vs_write(now)
        for (phase, kind), ratio in self.read_vs_write.items():
            buckets, total = ratio.cumulative()
            read_vs_write.add_metric([phase, kind], buckets, total)
        yield from (seats, requests, demand, read_vs_write)


def _dispatch(m: LevelMetrics, index: int) -> float | None:
    return m.dispatch[index] / SS_SCALE if m.dispatch is not None else None


class WaitingWatermark(InflightWatermark):
    """`apiserver_current_inqueue_requests{request_kind}`: the most requests of each kind waiting in
    APF's queues at once during the last completed second (the filter's `waitingMark`)."""

    HELP = "[ALPHA] Maximal number of queued requests in this apiserver per request kind in last second."

    def passed(self, kind: str, now: float) -> None:
        """A request entered and left its queue at `now` (dispatched as it arrived): the queue held one
        more request for an instant. With none waiting and the window still open (the common case)
        that is a mark of 1, set without the window's bookkeeping."""
        count = self.counts[kind]
        if count.current or now >= self.window_end:
            self.tick(now)
            if count.current + 1 > count.mark:
                count.mark = count.current + 1
        elif not count.mark:
            count.mark = 1

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            renamed = GaugeMetricFamily("apiserver_current_inqueue_requests", self.HELP, labels=["request_kind"])
            for sample in family.samples:
                renamed.add_metric([sample.labels["request_kind"]], sample.value)
            yield renamed
