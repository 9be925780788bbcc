"""kube-apiserver's request metrics, with upstream's names, labels, buckets and help texts.

Dashboards and SLO rules written for kube-apiserver (kubernetes-mixin, the SIG Scalability SLOs)
select `apiserver_request_total`, `apiserver_request_duration_seconds` and
`apiserver_request_sli_duration_seconds` by verb, scope, subresource and code; pointed at the
gateway's scrape job they work unchanged. Ported from k8s.io/apiserver
`pkg/endpoints/metrics/metrics.go` (`MonitorRequest`, `RecordRequestTermination`,
`RecordDroppedRequest`, `RecordLongRunning`, `UpdateInflightRequestMetrics`) and
`pkg/server/filters/maxinflight.go` (the 1 s in-flight watermark).

Which `component` the gateway records (`observe`'s argument), and why:

- `apiserver` for resource requests answered by kube-apiserver or by the gateway in its stead:
  forwarded to kube-apiserver (built-in groups, local APIServices), and the APIService API the
  gateway serves itself. kube-apiserver counts exactly these under `apiserver` (installer.go).
- `aggregator` for resource requests proxied to an extension API server, the label upstream's
  kube-aggregator proxy uses (`handler_proxy.go` `aggregatorComponent`). kube-apiserver itself
  counts only the proxy's terminations there; the gateway counts every proxied request, since
  that is most of its traffic, and the distinct label keeps `component="apiserver"` meaning what
  it means on kube-apiserver.
- The handlers upstream instruments with fixed labels, through `observe_handler`: aggregated
  discovery (`subresource="apis"`, component `apiserver`, `aggregated.NewResourceManager("apis")`),
  `/healthz`, `/livez`, `/readyz` (subresource = the path, component `""`, healthz.go
  `InstallPathHandlerWithHealthyFunc`) and OpenAPI v3 (`openapi/v3` for the root,
  `openapi/v3/` for a group-version, component `""`; kube-aggregator
  `pkg/controllers/openapiv3/aggregator`).

Not counted, as upstream: requests refused before a handler (401, 403, bad request info), paths no
route serves (404 from the router), legacy discovery, `/openapi/v2`, `/version`, `/metrics` and
the single health checks (`/readyz/<check>`). Self-defence refusals are counted through
`terminated` (and 429s also through `dropped`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from aggregator.web.fastmetrics import FastHistogram, fast_inc
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.requestlabels import (
    MUTATING_KIND,
    READ_ONLY_KIND,
    action_verb,
    canonical_verb,
    clean_scope,
    report_verb,
    route_scope,
)

APISERVER = "apiserver"  # metrics.go APIServerComponent
AGGREGATOR = "aggregator"  # kube-aggregator handler_proxy.go aggregatorComponent

# metrics.go requestLatencies: "customized significantly" for the API call latency SLOs.
REQUEST_DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0,
    4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
# metrics.go requestSliLatencies.
SLI_DURATION_BUCKETS = (
    0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0,
    4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
# metrics.go responseSizes: ExponentialBuckets(1000, 10, 7), 1 KB to 1 GB.
RESPONSE_SIZE_BUCKETS = tuple(1000.0 * 10.0**i for i in range(7))

_RESOURCE_LABELS = ("verb", "group", "version", "resource", "subresource", "scope", "component")
_SIZED_VERBS = frozenset({"GET", "LIST"})


class MonitoredRequest(Protocol):
    """What the request metrics read of one request (upstream reads them off `*http.Request` and
    its context); `web.context.RequestContext` holds them, each derived once."""

    @property
    def info(self) -> RequestInfo | None: ...

    @property
    def method(self) -> str: ...

    @property
    def watch(self) -> bool: ...  # metrics.go `getVerbIfWatch`

    @property
    def dry_run(self) -> str: ...  # metrics.go `cleanDryRun`

    @property
    def content_type(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _Series:
    """The labelled children one `MonitorRequest` call updates, looked up once per label set, and
    bound for the request path (`web.metrics.fast_inc`, `FastHistogram`)."""

    count: Callable[[float], None]
    duration: FastHistogram
    sli: FastHistogram | None
    size: FastHistogram | None


class KindCount:
    """One request kind's count in an `InflightWatermark`: requests now, the most at once during the
    current window, and what the last completed window published. Plain attributes: API Priority and
    Fairness's request path moves them inline (`flowcontrol/filter.py`)."""

    __slots__ = ("current", "mark", "published")

    def __init__(self) -> None:
        self.current = self.mark = self.published = 0


class InflightWatermark:
    """`apiserver_current_inflight_requests{request_kind}`: the most requests of each kind executing
    at once during the last completed second.

    Upstream records the occupancy when a request starts and when it ends, and a 1 s ticker
    publishes the highest value recorded since the previous tick and resets it
    (maxinflight.go `requestWatermark`, `startWatermarkMaintenance`). Here the ticks are computed
    from the clock when something records or Prometheus scrapes, so no background task is needed;
    as upstream, a second with nothing starting or ending publishes 0. A caller that moves a
    `KindCount` itself calls `tick` first once `window_end` has passed.
    """

    HELP = (
        "[STABLE] Maximal number of currently used inflight request limit of this apiserver per request "
        "kind in last second."
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic, period: float = 1.0) -> None:
        self._clock = clock
        self._period = period
        self.counts = {READ_ONLY_KIND: KindCount(), MUTATING_KIND: KindCount()}
        self.window_end = clock() + period

    def tick(self, now: float) -> None:
        if now < self.window_end:
            return
        windows = int((now - self.window_end) // self._period) + 1
        last_had_records = windows == 1
        for count in self.counts.values():
            count.published = count.mark if last_had_records else 0
            count.mark = 0
        self.window_end += windows * self._period

    def _record(self, count: KindCount) -> None:
        self.tick(self._clock())
        if count.current > count.mark:
            count.mark = count.current

    def started(self, kind: str) -> None:
        count = self.counts[kind]
        count.current += 1
        self._record(count)

    def finished(self, kind: str) -> None:
        count = self.counts[kind]
        count.current -= 1
        self._record(count)

    def moved(self, kind: str, delta: int, now: float | None = None) -> None:
        """`started` (delta 1) or `finished` (-1) in one call, at `now` when the caller has read the
        clock already."""
        count = self.counts[kind]
        value = count.current = count.current + delta
        if now is None:
            now = self._clock()
        if now >= self.window_end:
            self.tick(now)
        if value > count.mark:
            count.mark = value

    def executing(self, kind: str) -> int:
        """Requests of `kind` executing now (what a max-in-flight limit compares with)."""
        return self.counts[kind].current

    def published(self, kind: str) -> int:
        self.tick(self._clock())
        return self.counts[kind].published

    def collect(self) -> Iterator[Metric]:
        self.tick(self._clock())
        family = GaugeMetricFamily("apiserver_current_inflight_requests", self.HELP, labels=["request_kind"])
        for kind in (READ_ONLY_KIND, MUTATING_KIND):
            family.add_metric([kind], float(self.counts[kind].published))
        yield family


class RequestMetrics:
    """The apiserver_* request collectors of one gateway, and the calls that update them.

    `observe` is on every request's path: the labelled children are looked up once per distinct
    label set and kept, so an observation costs a few dictionary lookups and increments.
    """

    def __init__(self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.requests = Counter(
            "apiserver_request_total",
            "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, "
            "resource, scope, component, and HTTP response code.",
            ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component", "code"],
            registry=registry,
        )
        self.durations = Histogram(
            "apiserver_request_duration_seconds",
            "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, "
            "resource, subresource, scope and component.",
            ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component"],
            buckets=REQUEST_DURATION_BUCKETS,
            registry=registry,
        )
        # The gateway has no admission webhooks and no APF queues, the parts upstream subtracts, so
        # the SLI latency is the request latency; it is exported because current SLO rules use it.
        self.sli_durations = Histogram(
            "apiserver_request_sli_duration_seconds",
            "[ALPHA] Response latency distribution (not counting webhook duration and priority & fairness "
            "queue wait times) in seconds for each verb, group, version, resource, subresource, scope and "
            "component.",
            _RESOURCE_LABELS,
            buckets=SLI_DURATION_BUCKETS,
            registry=registry,
        )
        self.response_sizes = Histogram(
            "apiserver_response_sizes",
            "[STABLE] Response size distribution in bytes for each group, version, verb, resource, "
            "subresource, scope and component.",
            _RESOURCE_LABELS,
            buckets=RESPONSE_SIZE_BUCKETS,
            registry=registry,
        )
        self.longrunning = Gauge(
            "apiserver_longrunning_requests",
            "[STABLE] Gauge of all active long-running apiserver requests broken out by verb, group, "
            "version, resource, scope and component. Not all requests are tracked this way.",
            _RESOURCE_LABELS,
            registry=registry,
        )
        self.terminations = Counter(
            "apiserver_request_terminations_total",
            "[ALPHA] Number of requests which apiserver terminated in self-defense.",
            [*_RESOURCE_LABELS, "code"],
            registry=registry,
        )
        self.inflight = InflightWatermark(clock)
        registry.register(self.inflight)
        self._series: dict[tuple[str | int | bool, ...], _Series] = {}

    # --- MonitorRequest --------------------------------------------------------------------------

    def observe(
        self, request: MonitoredRequest, code: int, seconds: float, size: int, *, component: str
    ) -> None:
        """A resource request that reached a handler (installer.go's `InstrumentRouteFunc`).

        Non-resource requests have no REST route upstream and are not counted here: the few
        instrumented non-resource handlers go through `observe_handler`.
        """
        info = request.info
        if info is None or not info.is_resource_request:
            return
        self._monitor(
            request,
            action_verb(info, request.method),
            (info.api_group, info.api_version, info.resource, info.subresource, route_scope(info)),
            component,
            code,
            seconds,
            size,
        )

    def observe_handler(
        self,
        request: MonitoredRequest,
        code: int,
        seconds: float,
        size: int,
        *,
        subresource: str,
        component: str,
    ) -> None:
        """A handler upstream wraps in `InstrumentHandlerFunc("GET", "", "", "", subresource, "", component)`."""
        self._monitor(request, "GET", ("", "", "", subresource, ""), component, code, seconds, size)

    def _monitor(
        self,
        request: MonitoredRequest,
        verb: str,
        route: tuple[str, str, str, str, str],
        component: str,
        code: int,
        seconds: float,
        size: int,
    ) -> None:
        scope = route[4]
        reported = report_verb(
            canonical_verb(request.method.upper(), scope),
            verb,
            request.watch,
            request.content_type,
            request.info,
        )
        dry_run = request.dry_run
        sized = verb in _SIZED_VERBS
        key = (reported, dry_run, *route, component, code, sized)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new_series(reported, dry_run, route, component, code, sized)
        series.count(1)
        series.duration.observe(seconds)
        if series.sli is not None:
            series.sli.observe(seconds)
        if series.size is not None:
            series.size.observe(size)

    def _new_series(
        self,
        verb: str,
        dry_run: str,
        route: tuple[str, str, str, str, str],
        component: str,
        code: int,
        sized: bool,
    ) -> _Series:
        labels = (verb, *route, component)
        return _Series(
            fast_inc(self.requests.labels(verb, dry_run, *route, component, str(code))),
            FastHistogram(self.durations.labels(verb, dry_run, *route, component)),
            # Upstream observes the SLI only for requests that are not dry runs.
            FastHistogram(self.sli_durations.labels(*labels)) if dry_run == "" else None,
            # "We are only interested in response sizes of read requests."
            FastHistogram(self.response_sizes.labels(*labels)) if sized else None,
        )

    # --- self-defence and long-running requests ---------------------------------------------------

    def _cleaned(self, request: MonitoredRequest, info: RequestInfo) -> tuple[str, str]:
        """(verb, scope) as the Record* functions compute them: `CleanScope`, no route verb."""
        scope = clean_scope(info)
        verb = report_verb(
            canonical_verb(request.method.upper(), scope), "", request.watch, request.content_type, info
        )
        return verb, scope

    def terminated(self, request: MonitoredRequest, code: int, *, component: str) -> None:
        """`RecordRequestTermination`: a 429, 503 or 504 the gateway answered in self-defence.

        A non-resource request is labelled with its path as the subresource, as upstream does.
        """
        info = request.info
        if info is None:
            return  # no RequestInfo: authorization answers it with a 500 before anything else
        verb, scope = self._cleaned(request, info)
        if info.is_resource_request:
            route = (info.api_group, info.api_version, info.resource, info.subresource)
        else:
            route = ("", "", "", info.path)
        self.terminations.labels(verb, *route, scope, component, str(code)).inc()

    def dropped(self, request: MonitoredRequest, *, component: str) -> None:
        """`RecordDroppedRequest`: a max-in-flight 429 also counts in `apiserver_request_total`."""
        info = request.info
        if info is None:
            return
        verb, scope = self._cleaned(request, info)
        dry_run = request.dry_run
        # Upstream's non-resource branch labels with RequestInfo.Subresource (always empty there).
        group, version, resource = (
            (info.api_group, info.api_version, info.resource) if info.is_resource_request else ("", "", "")
        )
        self.requests.labels(
            verb, dry_run, group, version, resource, info.subresource, scope, component, "429"
        ).inc()

    def long_running_gauge(self, request: MonitoredRequest, *, component: str) -> Gauge | None:
        """`RecordLongRunning`: the child of `apiserver_longrunning_requests` the request counts in
        while it runs (the caller increments it, and decrements it at the end)."""
        info = request.info
        if info is None:
            return None
        verb, scope = self._cleaned(request, info)
        if info.is_resource_request:
            route = (info.api_group, info.api_version, info.resource, info.subresource)
        else:
            route = ("", "", "", info.path)
        return self.longrunning.labels(verb, *route, scope, component)
