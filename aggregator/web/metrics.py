"""Prometheus collectors, one registry per gateway (no process-global state, so tests can run many).

Names mirror upstream where upstream has the metric, with upstream's labels, buckets and help:
kube-aggregator's `aggregator_unavailable_apiservice`, kube-apiserver's `apiserver_request_*`
family (aggregator/web/requestmetrics.py) and audit counters, client-go's
`leader_election_master_status`, the `process_*` and `python_*` runtime collectors, and
`aggregator_build_info` modelled on `kubernetes_build_info`. What upstream lacks (per-APIService
proxy traffic, discovery freshness, auth caches, certificate expiry) uses the `aggregator_` prefix.

One label name for the APIService: upstream-named metrics keep upstream's label (`name` on
`aggregator_unavailable_apiservice`, as kube-aggregator's status controller has it); every metric
of the gateway's own calls it `apiservice`, as kube-aggregator's newer metrics do
(`aggregator_openapi_v2_regeneration_count{apiservice}`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from aggregator.web.certexpiry import CertificateExpiry
from aggregator.web.context import RequestContext
from aggregator.web.requestmetrics import RequestMetrics
from aggregator.web.serverrequest import Response
from aggregator.web.version import version_info

M = TypeVar("M", Counter, Gauge, Histogram)

# Connect and handshake phases: loopback and in-cluster ones take well under a millisecond.
_PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Children(Generic[M]):
    """The labelled children of one metric, each looked up once: `labels()` costs about 10 µs, and
    the request path and the background loops count under a few label sets each, many times a
    second. Values may be given as ints (an HTTP code): they are turned into text only the first
    time a label set is seen."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str | int, ...], M] = {}

    def __call__(self, *values: str | int) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*(str(v) for v in values))
        return child

    def remove(self, *values: str | int) -> None:
        """Drop the series (the APIService is gone), if it exists."""
        self._children.pop(values, None)
        with contextlib.suppress(KeyError):
            self.metric.remove(*(str(v) for v in values))


# Time-to-first-byte buckets of `aggregator_endpoint_first_byte_duration_seconds`.
FIRST_BYTE_BUCKETS = _LATENCY_BUCKETS


class EndpointSample(Protocol):
    """What `EndpointCounts` reads of one endpoint (`proxy/endpoints.Endpoint`)."""

    authority: str
    attempts: int
    first_byte_counts: list[int]  # per bucket of FIRST_BYTE_BUCKETS, then +Inf
    first_byte_sum: float


class EndpointCounts:
    """`aggregator_endpoint_requests_total` and `aggregator_endpoint_first_byte_duration_seconds`,
    collected from the endpoints' own counts (`add_source`: each request path's APIServices and
    their endpoints). An endpoint that leaves its Service leaves these series with it."""

    def __init__(self) -> None:
        self._sources: list[Callable[[], Iterable[tuple[str, Iterable[EndpointSample]]]]] = []

    def add_source(self, source: Callable[[], Iterable[tuple[str, Iterable[EndpointSample]]]]) -> None:
        self._sources.append(source)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "aggregator_endpoint_requests",
            "Attempts sent to each endpoint of an APIService (a retried request counts twice).",
            labels=["apiservice", "endpoint"],
        )
        first_byte = HistogramMetricFamily(
            "aggregator_endpoint_first_byte_duration_seconds",
            "Time from sending a request (on a connection made) to the answer's head, per endpoint.",
            labels=["apiservice", "endpoint"],
        )
        bounds = [*(floatToGoString(b) for b in FIRST_BYTE_BUCKETS), "+Inf"]  # type: ignore[no-untyped-call]
        for source in self._sources:
            for name, endpoints in source():
                for endpoint in endpoints:
                    labels = [name, endpoint.authority]
                    requests.add_metric(labels, endpoint.attempts)
                    cumulative, buckets = 0, []
                    for bound, count in zip(bounds, endpoint.first_byte_counts, strict=True):
                        cumulative += count
                        buckets.append((bound, cumulative))
                    first_byte.add_metric(labels, buckets, endpoint.first_byte_sum)
        yield requests
        yield first_byte


class UnavailableGauge:
    """`aggregator_unavailable_apiservice{name}`: a custom collector, as upstream's is.

    It shares its family name with the `aggregator_unavailable_apiservice_total` counter, which a
    standard Gauge could not (the registry would refuse the duplicate name).
    """

    HELP = "[ALPHA] Gauge of APIServices which are marked as unavailable broken down by APIService name."

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def set(self, name: str, unavailable: bool) -> None:
        self._values[name] = 1.0 if unavailable else 0.0

    def forget(self, name: str) -> None:
        self._values.pop(name, None)

    def value(self, name: str) -> float | None:
        return self._values.get(name)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("aggregator_unavailable_apiservice", self.HELP, labels=["name"])
        for name, value in sorted(self._values.items()):
            family.add_metric([name], value)
        yield family


# kubernetes_build_info's labels (component-base/metrics/version.go), from /version's fields.
_BUILD_INFO_LABELS = {
    "major": "major",
    "minor": "minor",
    "git_version": "gitVersion",
    "git_commit": "gitCommit",
    "git_tree_state": "gitTreeState",
    "build_date": "buildDate",
    "go_version": "goVersion",
    "compiler": "compiler",
    "platform": "platform",
}


def _register_runtime_collectors(registry: CollectorRegistry) -> None:
    """`process_*` (CPU, memory, file descriptors, start time), `python_info` and `python_gc_*`.

    prometheus_client registers these in its global registry on import; the gateway's registry
    gets its own instances, as Go components get the process and Go collectors.
    """
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)  # registers itself only on CPython (gc.get_stats)


class Metrics:
    def __init__(self) -> None:
        # `_created` series double the output and nobody graphs them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        r = self.registry = CollectorRegistry(auto_describe=False)
        _register_runtime_collectors(r)
        self.build_info = Gauge(
            "aggregator_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree "
            "state, build date, Python version (go_version, as /version's goVersion), and compiler from "
            "which the gateway was built, and platform on which it is running.",
            list(_BUILD_INFO_LABELS),
            registry=r,
        )
        info = version_info()
        self.build_info.labels(*(info[field] for field in _BUILD_INFO_LABELS.values())).set(1)
        self.certificate_expiry = CertificateExpiry()
        r.register(self.certificate_expiry)
        # kube-apiserver's request metrics (apiserver_request_total, ...), for the request pipeline.
        self.apiserver = RequestMetrics(r)
        # availability (upstream names and help text)
        self.unavailable_apiservice = UnavailableGauge()
        r.register(self.unavailable_apiservice)
        self.unavailable_apiservice_total = Counter(
            "aggregator_unavailable_apiservice",
            "[ALPHA] Counter of APIServices which are marked as unavailable broken down by APIService name "
            "and reason.",
            ["name", "reason"],
            registry=r,
        )
        # leader election (component-base metrics/prometheus/clientgo/leaderelection: names and help)
        self.leader_election_master_status = Gauge(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease. Please make sure to group "
            "by name.",
            ["name"],
            registry=r,
        )
        self.leader_election_slowpath = Counter(
            "leader_election_slowpath",
            "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string "
            "used to identify the lease. Please make sure to group by name.",
            ["name"],
            registry=r,
        )
        # requests the gateway serves, by route
        self.requests = Counter(
            "aggregator_requests",
            "Requests served, by route kind and HTTP code.",
            ["route", "code"],
            registry=r,
        )
        # proxy
        self.proxy_requests = Counter(
            "aggregator_proxy_requests",
            "Requests proxied to extension API servers, by APIService, verb and HTTP code.",
            ["apiservice", "verb", "code"],
            registry=r,
        )
        self.proxy_duration = Histogram(
            "aggregator_proxy_request_duration_seconds",
            "Time to the backend's response headers, by APIService and verb.",
            ["apiservice", "verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_errors = Counter(
            "aggregator_backend_errors",
            "Failures reaching a backend, by APIService and kind (resolve, connect, tls, timeout, redirect).",
            ["apiservice", "kind"],
            registry=r,
        )
        # per APIService and endpoint (`proxy/endpoints.py`): the endpoint label is `ip:port` of a
        # ready endpoint (the cluster IP without --enable-aggregator-routing), so a Service's series
        # are as many as its endpoints; an endpoint's series go when it leaves the Service.
        # Attempts and times to first byte per endpoint: counted on the endpoint objects themselves
        # (an int and a bucket list, no lock or label lookup per request), read at scrape time.
        self.endpoint_counts = EndpointCounts()
        r.register(self.endpoint_counts)
        self.endpoint_errors = Counter(
            "aggregator_endpoint_errors",
            "Failed attempts per endpoint, by kind (connect, tls, timeout, reset, answer: a 502/503/504).",
            ["apiservice", "endpoint", "kind"],
            registry=r,
        )
        self.endpoint_retries = Counter(
            "aggregator_endpoint_retries",
            "Requests retried on another endpoint after this one failed, by why they could be "
            "(unsent: never reached it; idempotent: a GET, HEAD or OPTIONS with no answer yet).",
            ["apiservice", "endpoint", "reason"],
            registry=r,
        )
        self.endpoint_ejections = Counter(
            "aggregator_endpoint_ejections",
            "Endpoints ejected by passive outlier detection, by reason (unreachable, answers).",
            ["apiservice", "endpoint", "reason"],
            registry=r,
        )
        self.endpoint_ejected = Gauge(
            "aggregator_endpoint_ejected",
            "1 while the endpoint is ejected (with --workers N: how many workers hold it ejected).",
            ["apiservice", "endpoint"],
            registry=r,
        )
        self.endpoint_dial = Histogram(
            "aggregator_endpoint_dial_duration_seconds",
            "TCP connect time of new connections, per endpoint.",
            ["apiservice", "endpoint"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.endpoint_tls = Histogram(
            "aggregator_endpoint_tls_handshake_duration_seconds",
            "TLS handshake time of new connections, per endpoint.",
            ["apiservice", "endpoint"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.apiservice_rejected = Counter(
            "aggregator_apiservice_rejected_requests",
            "Requests answered 429 because the APIService's max-concurrent-requests were in flight.",
            ["apiservice"],
            registry=r,
        )
        self.insecure_backends = Gauge(
            "aggregator_insecure_backends",
            "1 for each APIService proxied with insecureSkipTLSVerify.",
            ["apiservice"],
            registry=r,
        )
        self.upgrade_rejected = Counter(
            "aggregator_upgrade_rejected",
            "Protocol upgrades not tunnelled, by reason (path: never on discovery/health/metrics; "
            "protocol: not SPDY/3.1 or websocket; body: the request carries a body; non101: the backend did "
            "not switch protocols).",
            ["reason"],
            registry=r,
        )
        # discovery
        self.discovery_fetches = Counter(
            "aggregator_discovery_fetches",
            "Discovery fetches by source (an APIService name, or kube-apiserver in kube mode) and outcome "
            "(aggregated, not_modified, legacy, error).",
            ["apiservice", "result"],
            registry=r,
        )
        self.discovery_last_success = Gauge(
            "aggregator_discovery_last_success_timestamp_seconds",
            "Unix time of the last good discovery fetch, by source (APIService name or kube-apiserver).",
            ["apiservice"],
            registry=r,
        )
        self.discovery_aggregations = Counter(
            "aggregator_discovery_aggregation_count",
            "Times the aggregated discovery document was regenerated.",
            registry=r,
        )
        # OpenAPI aggregation
        self.openapi_fetches = Counter(
            "aggregator_openapi_fetches",
            "OpenAPI downloads, by APIService (or kube-apiserver; a download shared by the APIServices of "
            "one Service counts for each), document (v2, v3) and outcome (ok, not_modified, not_found, "
            "error; moved: a document's hash moved, the index is read again).",
            ["apiservice", "document", "result"],
            registry=r,
        )
        self.openapi_v2_merges = Counter(
            "aggregator_openapi_v2_merges",
            "Times the merged OpenAPI v2 document was rebuilt (only when an input changed).",
            registry=r,
        )
        self.openapi_v2_merge_duration = Gauge(
            "aggregator_openapi_v2_merge_duration_seconds",
            "Seconds the last OpenAPI v2 merge took (merge, JSON, protobuf and gzip renderings).",
            registry=r,
        )
        # authentication / authorization
        self.authn_cache = Counter(
            "aggregator_authentication_cache",
            "Token cache lookups by result (hit, miss).",
            ["result"],
            registry=r,
        )
        self.authz_cache = Counter(
            "aggregator_authorization_cache",
            "SubjectAccessReview cache lookups by result (hit, miss).",
            ["result"],
            registry=r,
        )
        self.review_duration = Histogram(
            "aggregator_webhook_review_duration_seconds",
            "Latency of TokenReview and SubjectAccessReview calls.",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.reviews_in_flight = Gauge(
            "aggregator_webhook_reviews_in_flight", "Reviews awaiting kube-apiserver.", ["kind"], registry=r
        )
        # audit (k8s.io/apiserver pkg/audit/metrics.go: upstream names and help text)
        self.audit_events = Counter(
            "apiserver_audit_event",
            "[ALPHA] Counter of audit events generated and sent to the audit backend.",
            registry=r,
        )
        self.audit_errors = Counter(
            "apiserver_audit_error",
            "[ALPHA] Counter of audit events that failed to be audited properly. Plugin identifies the "
            "plugin affected by the error.",
            ["plugin"],
            registry=r,
        )
        self.audit_levels = Counter(
            "apiserver_audit_level",
            "[ALPHA] Counter of policy levels for audit events (1 per request).",
            ["level"],
            registry=r,
        )
        # object sources
        self.watch_restarts = Counter(
            "aggregator_watch_restarts", "Watches restarted, by resource.", ["resource"], registry=r
        )
        self.watch_relists = Counter(
            "aggregator_watch_relists",
            "Full relists (410 Gone or ERROR events), by resource.",
            ["resource"],
            registry=r,
        )

    async def handle(self, ctx: RequestContext) -> Response:
        """`GET /metrics` in the Prometheus (or OpenMetrics, when asked) text format."""
        encoder, content_type = choose_encoder(ctx.headers.get("Accept", ""))
        return Response(200, encoder(self.registry), content_type=content_type)
