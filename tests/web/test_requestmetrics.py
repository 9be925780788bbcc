"""kube-apiserver's request metrics: names, labels, buckets and label values as upstream has them.

The tables in the first part are ported from k8s.io/apiserver pkg/endpoints/metrics/metrics_test.go
(TestCleanVerb, TestCleanScope, TestRecordDroppedRequests); the expected metric definitions are
written out from metrics.go, so a drift on either side fails here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aggregator.web.context import RequestContext, is_long_running
from aggregator.web.inflight import MaxInFlight
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.requestlabels import (
    clean_dry_run,
    clean_scope,
    report_verb,
    request_kind,
    watch_requested,
)
from aggregator.web.requestmetrics import AGGREGATOR, APISERVER, RequestMetrics
from aggregator.wire.gourl import parse_query
from tests.support.contexts import context_for

# --- metrics_test.go TestCleanVerb -------------------------------------------------------------------


@dataclass(frozen=True)
class VerbCase:
    desc: str
    initial: str
    expected: str
    suggested: str = ""
    method: str = ""
    raw_query: str = ""
    content_type: str = ""
    info: RequestInfo | None = None


def _resource_info(verb: str, resource: str, subresource: str) -> RequestInfo:
    return RequestInfo(True, "", verb, resource=resource, subresource=subresource)


CLEAN_VERB_CASES = [
    VerbCase("An empty string should be designated as unknown", "", "other"),
    VerbCase("LIST should normally map to LIST", "LIST", "LIST"),
    VerbCase(
        "LIST should be transformed to WATCH if we have the right query param on the request",
        "LIST",
        "WATCH",
        method="GET",
        raw_query="watch=true",
    ),
    VerbCase(
        "LIST isn't transformed to WATCH if we have query params that do not include watch",
        "LIST",
        "LIST",
        method="GET",
        raw_query="blah=asdf&something=else",
    ),
    VerbCase(
        "GET is transformed to WATCH if we have the right query param on the request",
        "GET",
        "WATCH",
        method="GET",
        raw_query="watch=true",
    ),
    VerbCase(
        "LIST is transformed to WATCH for the old pattern watch",
        "LIST",
        "WATCH",
        suggested="WATCH",
        method="GET",
        raw_query="/api/v1/watch/pods",
    ),
    VerbCase(
        "LIST is transformed to WATCH for the old pattern watchlist",
        "LIST",
        "WATCH",
        suggested="WATCHLIST",
        method="GET",
        raw_query="/api/v1/watch/pods",
    ),
    VerbCase("WATCHLIST should be transformed to WATCH", "WATCHLIST", "WATCH"),
    VerbCase(
        "PATCH should be transformed to APPLY with the right content type",
        "PATCH",
        "APPLY",
        content_type="application/apply-patch+yaml",
    ),
    VerbCase("PATCH shouldn't be transformed to APPLY without the right content type", "PATCH", "PATCH"),
    VerbCase("unexpected verbs should be designated as unknown", "notValid", "other"),
    VerbCase(
        "Pod logs should be transformed to CONNECT",
        "GET",
        "CONNECT",
        method="GET",
        raw_query="/api/v1/namespaces/default/pods/test-pod/log",
        info=_resource_info("GET", "pods", "log"),
    ),
    VerbCase(
        "Pod exec should be transformed to CONNECT",
        "POST",
        "CONNECT",
        method="POST",
        raw_query="/api/v1/namespaces/default/pods/test-pod/exec?command=sh",
        info=_resource_info("POST", "pods", "exec"),
    ),
    VerbCase(
        "Pod portforward should be transformed to CONNECT",
        "POST",
        "CONNECT",
        method="POST",
        raw_query="/api/v1/namespaces/default/pods/test-pod/portforward",
        info=_resource_info("POST", "pods", "portforward"),
    ),
    VerbCase(
        "Deployment scale should not be transformed to CONNECT",
        "PUT",
        "PUT",
        method="PUT",
        raw_query="/apis/apps/v1/namespaces/default/deployments/test-1/scale",
        info=_resource_info("PUT", "deployments", "scale"),
    ),
]


@pytest.mark.parametrize("case", CLEAN_VERB_CASES, ids=lambda c: c.desc)
def test_clean_verb(case: VerbCase) -> None:
    watch = watch_requested(case.method, parse_query(case.raw_query))
    got = report_verb(case.initial, case.suggested, watch, case.content_type, case.info)
    assert got == case.expected


# --- metrics_test.go TestCleanScope ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "scope"),
    [
        (RequestInfo(False, "", ""), ""),
        (RequestInfo(False, "", "", name="my-resource", namespace="my-namespace"), "resource"),
        (RequestInfo(False, "", "create", namespace="my-namespace"), "resource"),
        (RequestInfo(False, "", "", namespace="my-namespace"), "namespace"),
        (RequestInfo(True, "", ""), "cluster"),
    ],
    ids=["empty scope", "resource scope", "POST resource scope", "namespace scope", "cluster scope"],
)
def test_clean_scope(info: RequestInfo, scope: str) -> None:
    assert clean_scope(info) == scope


# --- cleanDryRun (validation.ValidateDryRun allows only "All") ---------------------------------------


@pytest.mark.parametrize(
    ("raw_query", "label"),
    [
        ("", ""),
        ("pretty=true", ""),
        ("dryRun=All", "All"),
        ("dryRun=All&dryRun=All", "All"),  # distinct values only
        ("dryRun=", "invalid"),
        ("dryRun", "invalid"),
        ("dryRun=all", "invalid"),  # case matters
        ("dryRun=All&dryRun=Server", "invalid"),
        ("xdryRunx=1", ""),  # mentioned, but no dryRun parameter
        ("dryRun=%41ll", "All"),  # decoded as Go's URL.Query() decodes
    ],
)
def test_clean_dry_run(raw_query: str, label: str) -> None:
    assert clean_dry_run(parse_query(raw_query)) == label


# --- the whole MonitorRequest, from real request paths ---------------------------------------------


def request(method: str, target: str, content_type: str = "") -> RequestContext:
    return context_for(method, target, headers={"Content-Type": content_type} if content_type else None)


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """`name`'s samples as {sorted label items: value}."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def counted(metrics: RequestMetrics, registry: CollectorRegistry) -> dict[str, str]:
    """The labels of the one `apiserver_request_total` series."""
    (labels,) = samples(registry, "apiserver_request_total")
    return dict(labels)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=False)


@pytest.fixture
def metrics(registry: CollectorRegistry) -> RequestMetrics:
    return RequestMetrics(registry)


def labels(verb: str, scope: str, resource: str = "pods", **extra: str) -> dict[str, str]:
    return {
        "verb": verb,
        "dry_run": "",
        "group": "",
        "version": "v1",
        "resource": resource,
        "subresource": "",
        "scope": scope,
        "component": APISERVER,
        "code": "200",
        **extra,
    }


MONITOR_CASES = [
    ("GET", "/api/v1/namespaces/ns/pods/p", "", labels("GET", "resource")),
    ("HEAD", "/api/v1/namespaces/ns/pods/p", "", labels("GET", "resource")),
    ("GET", "/api/v1/namespaces/ns/pods", "", labels("LIST", "namespace")),
    ("GET", "/api/v1/pods", "", labels("LIST", "cluster")),
    ("GET", "/api/v1/nodes", "", labels("LIST", "cluster", resource="nodes")),
    ("GET", "/api/v1/namespaces/ns", "", labels("GET", "resource", resource="namespaces")),
    # The route is the collection's, so a name selected by field stays a LIST of that scope.
    ("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dp", "", labels("LIST", "namespace")),
    ("GET", "/api/v1/pods?watch=1", "", labels("WATCH", "cluster")),
    ("GET", "/api/v1/pods?watch=false", "", labels("LIST", "cluster")),
    ("GET", "/api/v1/namespaces/ns/pods/p?watch=true", "", labels("WATCH", "resource")),
    ("GET", "/api/v1/watch/namespaces/ns/pods", "", labels("WATCH", "namespace")),
    ("GET", "/api/v1/watch/namespaces/ns/pods/p", "", labels("WATCH", "resource")),
    ("POST", "/api/v1/namespaces/ns/pods", "", labels("POST", "resource")),
    ("POST", "/api/v1/namespaces/ns/pods?dryRun=All", "", labels("POST", "resource", dry_run="All")),
    ("PUT", "/api/v1/namespaces/ns/pods/p/status", "", labels("PUT", "resource", subresource="status")),
    ("PATCH", "/api/v1/namespaces/ns/pods/p", "application/merge-patch+json", labels("PATCH", "resource")),
    ("PATCH", "/api/v1/namespaces/ns/pods/p", "application/apply-patch+yaml", labels("APPLY", "resource")),
    ("DELETE", "/api/v1/namespaces/ns/pods/p", "", labels("DELETE", "resource")),
    # The verb comes from the method: a delete-collection is a DELETE of the collection's scope.
    ("DELETE", "/api/v1/namespaces/ns/pods", "", labels("DELETE", "namespace")),
    ("GET", "/api/v1/namespaces/ns/pods/p/log", "", labels("CONNECT", "resource", subresource="log")),
    ("POST", "/api/v1/namespaces/ns/pods/p/exec", "", labels("CONNECT", "resource", subresource="exec")),
    ("OPTIONS", "/api/v1/namespaces/ns/pods/p", "", labels("other", "resource")),
    (
        "GET",
        "/apis/wardle.example.com/v1beta1/flunders",
        "",
        labels("LIST", "cluster", resource="flunders", group="wardle.example.com", version="v1beta1"),
    ),
]


@pytest.mark.parametrize(("method", "target", "content_type", "expected"), MONITOR_CASES)
def test_observe_labels_a_request_as_kube_apiserver_does(
    method: str,
    target: str,
    content_type: str,
    expected: dict[str, str],
    metrics: RequestMetrics,
    registry: CollectorRegistry,
) -> None:
    metrics.observe(request(method, target, content_type), 200, 0.01, 10, component=APISERVER)
    assert counted(metrics, registry) == expected


def test_the_component_is_the_callers(metrics: RequestMetrics, registry: CollectorRegistry) -> None:
    metrics.observe(
        request("GET", "/apis/wardle.example.com/v1beta1/flunders"), 503, 0.2, 0, component=AGGREGATOR
    )
    assert counted(metrics, registry)["component"] == "aggregator"
    assert counted(metrics, registry)["code"] == "503"


def test_non_resource_requests_are_not_counted_by_observe(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    # No REST route serves them upstream: only the instrumented handlers count, via observe_handler.
    metrics.observe(request("GET", "/version"), 200, 0.01, 10, component=APISERVER)
    metrics.observe(request("GET", "/apis/wardle.example.com"), 200, 0.01, 10, component=APISERVER)
    assert samples(registry, "apiserver_request_total") == {}


def test_observe_handler_labels_as_instrument_handler_func(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_handler(request("GET", "/readyz"), 200, 0.001, 2, subresource="/readyz", component="")
    assert counted(metrics, registry) == {
        "verb": "GET",
        "dry_run": "",
        "group": "",
        "version": "",
        "resource": "",
        "subresource": "/readyz",
        "scope": "",
        "component": "",
        "code": "200",
    }
    sizes = samples(registry, "apiserver_response_sizes_count")
    assert list(sizes.values()) == [1.0]


def test_durations_sli_and_sizes_follow_monitor_request(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe(request("GET", "/api/v1/namespaces/ns/pods"), 200, 0.3, 5000, component=APISERVER)
    metrics.observe(request("GET", "/api/v1/namespaces/ns/pods?watch=1"), 200, 40.0, 90, component=APISERVER)
    metrics.observe(request("GET", "/api/v1/watch/namespaces/ns/pods"), 200, 40.0, 90, component=APISERVER)
    metrics.observe(
        request("POST", "/api/v1/namespaces/ns/pods?dryRun=All"), 201, 0.05, 300, component=APISERVER
    )

    def by_verb(name: str) -> dict[tuple[str, str], float]:
        return {(dict(k)["verb"], dict(k).get("dry_run", "-")): v for k, v in samples(registry, name).items()}

    assert by_verb("apiserver_request_total") == {("LIST", ""): 1, ("WATCH", ""): 2, ("POST", "All"): 1}
    assert by_verb("apiserver_request_duration_seconds_sum") == {
        ("LIST", ""): 0.3,
        ("WATCH", ""): 80.0,
        ("POST", "All"): 0.05,
    }
    # The SLI histogram has no dry_run label and leaves dry runs out.
    assert by_verb("apiserver_request_sli_duration_seconds_count") == {("LIST", "-"): 1, ("WATCH", "-"): 2}
    # Sizes only for GET/LIST routes: `?watch=1` is the LIST route, `/watch/...` is not.
    assert by_verb("apiserver_response_sizes_sum") == {("LIST", "-"): 5000, ("WATCH", "-"): 90}


def test_a_repeated_label_set_reuses_its_children(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    req = request("GET", "/api/v1/namespaces/ns/pods/p")
    for _ in range(3):
        metrics.observe(req, 200, 0.01, 10, component=APISERVER)
    assert len(metrics._series) == 1
    assert list(samples(registry, "apiserver_request_total").values()) == [3.0]


# --- metrics_test.go TestRecordDroppedRequests, terminations, long-running ------------------------


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("GET", "/api/v1/pods", labels("LIST", "cluster", code="429")),
        ("POST", "/api/v1/namespaces/foo/pods", labels("POST", "resource", code="429")),
        (
            "PATCH",
            "/apis/batch/v1/namespaces/foo/jobs/bar/status?dryRun=All",
            labels(
                "PATCH",
                "resource",
                resource="jobs",
                group="batch",
                subresource="status",
                dry_run="All",
                code="429",
            ),
        ),
    ],
    ids=["list pods", "post pods", "dry-run patch job status"],
)
def test_dropped_requests(
    method: str, target: str, expected: dict[str, str], metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    metrics.dropped(request(method, target), component=APISERVER)
    assert counted(metrics, registry) == expected


def test_terminations_use_clean_scope_and_the_path_for_non_resource_requests(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    metrics.terminated(
        request("GET", "/apis/wardle.example.com/v1beta1/namespaces/ns/flunders"), 503, component=AGGREGATOR
    )
    metrics.terminated(request("GET", "/openapi/v2"), 504, component=APISERVER)
    assert set(samples(registry, "apiserver_request_terminations_total")) == {
        tuple(
            sorted(
                {
                    "verb": "LIST",
                    "group": "wardle.example.com",
                    "version": "v1beta1",
                    "resource": "flunders",
                    "subresource": "",
                    "scope": "namespace",
                    "component": "aggregator",
                    "code": "503",
                }.items()
            )
        ),
        tuple(
            sorted(
                {
                    "verb": "GET",
                    "group": "",
                    "version": "",
                    "resource": "",
                    "subresource": "/openapi/v2",
                    "scope": "",
                    "component": "apiserver",
                    "code": "504",
                }.items()
            )
        ),
    }


def test_long_running_requests_are_counted_while_they_run(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    watch = request("GET", "/api/v1/namespaces/ns/pods?watch=1")
    assert watch.long_running

    def gauge() -> list[tuple[str, float]]:
        return [(dict(k)["verb"], v) for k, v in samples(registry, "apiserver_longrunning_requests").items()]

    child = metrics.long_running_gauge(watch, component=APISERVER)
    assert child is not None
    child.inc()
    assert gauge() == [("WATCH", 1.0)]
    child.dec()
    assert gauge() == [("WATCH", 0.0)]


@pytest.mark.parametrize(
    ("method", "target", "long_running", "kind"),
    [
        ("GET", "/api/v1/pods?watch=true", True, "readOnly"),
        ("GET", "/api/v1/watch/pods", True, "readOnly"),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", True, "readOnly"),
        ("POST", "/api/v1/namespaces/ns/pods/p/exec", True, "mutating"),
        ("GET", "/api/v1/namespaces/ns/services/s/proxy/x", True, "readOnly"),
        ("GET", "/debug/pprof/profile", True, "readOnly"),  # non-resource verb: the method, "get"
        ("GET", "/api/v1/pods", False, "readOnly"),
        ("GET", "/api/v1/namespaces/ns/pods/p/status", False, "readOnly"),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", False, "mutating"),
        ("GET", "/healthz", False, "readOnly"),
    ],
)
def test_long_running_and_request_kind_follow_kube_apiserver(
    method: str, target: str, long_running: bool, kind: str
) -> None:
    # BasicLongRunningRequestCheck with kube-apiserver's sets; maxinflight's read-only verbs.
    info = request(method, target).info
    assert info is not None
    assert (is_long_running(info, upgrade=False), request_kind(info)) == (long_running, kind)


# --- apiserver_current_inflight_requests: the 1 s high-water mark ------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_inflight_publishes_the_last_seconds_high_water_mark(registry: CollectorRegistry) -> None:
    clock = Clock()
    metrics = RequestMetrics(registry, clock=clock)
    get = request("GET", "/api/v1/namespaces/ns/pods/p")
    post = request("POST", "/api/v1/namespaces/ns/pods")
    watch = request("GET", "/api/v1/pods?watch=1")

    def published() -> dict[str, float]:
        return {
            dict(k)["request_kind"]: v
            for k, v in samples(registry, "apiserver_current_inflight_requests").items()
        }

    limits = MaxInFlight(metrics, read_only=10, mutating=10)  # what feeds the watermark

    def run(*contexts: RequestContext) -> None:
        for ctx in contexts:
            assert limits.gate(ctx) is None

    def end(*contexts: RequestContext) -> None:
        for ctx in contexts:
            limits.finished(ctx, None, None)

    assert published() == {"readOnly": 0, "mutating": 0}
    second_get = request("GET", "/api/v1/namespaces/ns/pods/p")
    run(get, second_get, post, watch)
    clock.now += 0.5
    assert published() == {"readOnly": 0, "mutating": 0}  # the window is not over yet
    assert metrics.inflight.executing("readOnly") == 2  # the watch is long-running: exempt
    end(get, second_get, post, watch)
    clock.now += 0.6  # the first window closed with 2 reads and 1 write at once
    assert published() == {"readOnly": 2, "mutating": 1}
    again = request("GET", "/api/v1/namespaces/ns/pods/p")
    run(again)
    end(again)
    clock.now += 1.0
    assert published() == {"readOnly": 1, "mutating": 0}
    clock.now += 1.0  # a second in which nothing started or ended publishes 0, as upstream
    assert published() == {"readOnly": 0, "mutating": 0}


# --- names, types, label names and buckets: upstream's, written out from metrics.go ----------------

RESOURCE = ["verb", "group", "version", "resource", "subresource", "scope", "component"]
UPSTREAM = {
    "apiserver_request_total": (
        "counter",
        ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component", "code"],
    ),
    "apiserver_request_duration_seconds": (
        "histogram",
        ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component"],
    ),
    "apiserver_request_sli_duration_seconds": ("histogram", RESOURCE),
    "apiserver_response_sizes": ("histogram", RESOURCE),
    "apiserver_longrunning_requests": ("gauge", RESOURCE),
    "apiserver_request_terminations_total": ("counter", [*RESOURCE, "code"]),
    "apiserver_current_inflight_requests": ("gauge", ["request_kind"]),
}
UPSTREAM_BUCKETS = {
    "apiserver_request_duration_seconds": [
        0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3,
        4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    ],
    "apiserver_request_sli_duration_seconds": [
        0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3,
        4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    ],
    "apiserver_response_sizes": [1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9],
}  # fmt: skip
UPSTREAM_STABILITY = {
    "apiserver_request_total": "STABLE",
    "apiserver_request_duration_seconds": "STABLE",
    "apiserver_request_sli_duration_seconds": "ALPHA",
    "apiserver_response_sizes": "STABLE",
    "apiserver_longrunning_requests": "STABLE",
    "apiserver_request_terminations_total": "ALPHA",
    "apiserver_current_inflight_requests": "STABLE",
}


def test_names_types_labels_and_buckets_are_upstreams(
    metrics: RequestMetrics, registry: CollectorRegistry
) -> None:
    # One of everything, so every family has a series to read its label names from.
    get = request("GET", "/api/v1/namespaces/ns/pods")
    metrics.observe(get, 200, 0.01, 10, component=APISERVER)
    metrics.terminated(get, 504, component=APISERVER)
    child = metrics.long_running_gauge(request("GET", "/api/v1/pods?watch=1"), component=APISERVER)
    assert child is not None
    child.inc()
    child.dec()

    exposed = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, off in the gateway (Metrics)
        name = family.name + ("_total" if family.type == "counter" else "")
        label_names = [k for k in family.samples[0].labels if k != "le"]
        buckets = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
        exposed[name] = (family.type, label_names, buckets, family.documentation)

    assert set(exposed) == set(UPSTREAM)
    for name, (kind, label_names) in UPSTREAM.items():
        got_kind, got_labels, buckets, help_text = exposed[name]
        assert (got_kind, sorted(got_labels)) == (kind, sorted(label_names)), name
        assert help_text.startswith(f"[{UPSTREAM_STABILITY[name]}] "), name
        if name in UPSTREAM_BUCKETS:
            assert buckets == [*UPSTREAM_BUCKETS[name], float("inf")], name
