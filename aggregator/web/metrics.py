"""Prometheus collectors, one registry per gateway (no process-global state, so tests can run many).

This module holds the registry, what belongs to no one feature (build info, the runtime
collectors, certificate expiry), `Families` (how a feature declares its own) and `GET /metrics`.
Each feature declares its own metrics in a small class taking the registry, next to the code that
records them: `availability/metrics.py`, `backends/metrics.py`, `proxy/metrics.py`,
`discovery/metrics.py`, `openapi/metrics.py`, `auth/metrics.py`, `audit/recorder.py`,
`sources/reflector.py`, `leaderelection.py`, `web/requestmetrics.py` and `web/pipeline.py`; the
composition root (`gatewaymetrics.py`) declares them all on one registry per process.

Names mirror upstream where upstream has the metric, with upstream's labels, buckets and help:
kube-aggregator's `aggregator_unavailable_apiservice`, kube-apiserver's `apiserver_request_*`
family and audit counters, client-go's `leader_election_master_status`, the `process_*` and
`python_*` runtime collectors, and `aggregator_build_info` modelled on `kubernetes_build_info`.
What upstream lacks (per-APIService proxy traffic, discovery freshness, auth caches, certificate
expiry) uses the `aggregator_` prefix.

One label name for the APIService: upstream-named metrics keep upstream's label (`name` on
`aggregator_unavailable_apiservice`, as kube-aggregator's status controller has it); every metric
of the gateway's own calls it `apiservice`, as kube-aggregator's newer metrics do
(`aggregator_openapi_v2_regeneration_count{apiservice}`).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

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
from prometheus_client.exposition import choose_encoder

from aggregator.web.certexpiry import CertificateExpiry
from aggregator.web.context import RequestContext
from aggregator.web.fastmetrics import FastHistogram, fast_inc
from aggregator.web.serverrequest import Response
from aggregator.web.version import version_info

M = TypeVar("M", Counter, Gauge, Histogram)

# Request latencies: the proxy's time to response headers, webhook reviews, time to first byte.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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


class Increments:
    """The bound increments (`fast_inc`) of one counter's children, each looked up once: what the
    request path counts with (`Children` for everything else)."""

    def __init__(self, metric: Counter) -> None:
        self._children = Children(metric)
        self._incs: dict[tuple[str | int | enum.Enum, ...], Callable[[float], None]] = {}

    def __call__(self, *values: str | int | enum.Enum) -> Callable[[float], None]:
        """The increment of the child labelled `values`; an enum member is labelled with its
        value (looked up once: `Enum.value` is a Python property, too dear on every request)."""
        inc = self._incs.get(values)
        if inc is None:
            labels = (value.value if isinstance(value, enum.Enum) else value for value in values)
            inc = self._incs[values] = fast_inc(self._children(*labels))
        return inc


class Observers:
    """The bound observes (`FastHistogram`) of one histogram's children, each looked up once."""

    def __init__(self, metric: Histogram) -> None:
        self._children = Children(metric)
        self._observers: dict[tuple[str | int, ...], FastHistogram] = {}

    def __call__(self, *values: str | int) -> FastHistogram:
        observer = self._observers.get(values)
        if observer is None:
            observer = self._observers[values] = FastHistogram(self._children(*values))
        return observer


class Families:
    """Declares one feature's metric families on its registry: each family is its name, help text
    and label names (and a histogram's buckets), the registry named once, so a feature's metrics
    class reads as the list of what it exports. (`requestmetrics.py` declares its own directly:
    it sits below this module in the web package's layers.)"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)


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
    """The gateway's registry and what belongs to no one feature: build info, the runtime
    collectors, certificate expiry, and `GET /metrics`. Each feature declares its own metrics on
    `registry` (`availability/metrics.py`, `proxy/metrics.py`, ...)."""

    def __init__(self) -> None:
        # `_created` series double the output and nobody graphs them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        _register_runtime_collectors(self.registry)
        self.build_info = Gauge(
            "aggregator_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree "
            "state, build date, Python version (go_version, as /version's goVersion), and compiler from "
            "which the gateway was built, and platform on which it is running.",
            list(_BUILD_INFO_LABELS),
            registry=self.registry,
        )
        info = version_info()
        self.build_info.labels(*(info[field] for field in _BUILD_INFO_LABELS.values())).set(1)
        self.certificate_expiry = CertificateExpiry()
        self.registry.register(self.certificate_expiry)

    async def handle(self, ctx: RequestContext) -> Response:
        """`GET /metrics` in the Prometheus (or OpenMetrics, when asked) text format."""
        encoder, content_type = choose_encoder(ctx.headers.get("Accept", ""))
        return Response(200, encoder(self.registry), content_type=content_type)
