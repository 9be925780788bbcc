"""The per-endpoint metrics of proxied requests, and the log lines of ejections.

Labels are the APIService and the endpoint (`ip:port`): as many series per APIService as its
Service has ready endpoints (one, the cluster IP, without --enable-aggregator-routing). An endpoint
that leaves the Service loses its series (`forget`), so a Deployment rolling its pods does not
leave a trail of dead ones behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from aggregator.backends.h1 import DialTimes
from aggregator.proxy.endpoints import FIRST_BYTE_BUCKETS, Endpoint
from aggregator.util.logs import fields
from aggregator.web.metrics import Children

log = logging.getLogger(__name__)

UNSENT = "unsent"
IDEMPOTENT = "idempotent"


# Each request path's APIServices and their endpoints (`HandlingTable`), read at scrape time.
EndpointSource = Callable[[], Iterable[tuple[str, Iterable[Endpoint]]]]


class EndpointCounts:
    """`aggregator_endpoint_requests_total` and `aggregator_endpoint_first_byte_duration_seconds`,
    collected from the endpoints' own counts (an int and a bucket list on each `Endpoint`: no lock
    or label lookup per request). An endpoint that leaves its Service leaves these series with it."""

    def __init__(self) -> None:
        self._sources: list[EndpointSource] = []

    def add_source(self, source: EndpointSource) -> None:
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


def _per_endpoint(registry: CollectorRegistry, name: str, documentation: str, label: str) -> Children[Counter]:
    """A counter per APIService, endpoint and `label`, its children looked up once."""
    return Children(Counter(name, documentation, ["apiservice", "endpoint", label], registry=registry))


class EndpointMetrics:
    """Per APIService and endpoint: attempts and times to first byte (`EndpointCounts`), failures,
    retries and ejections; the dial and handshake histograms are the backends' (`BackendMetrics`),
    observed here, where the endpoint is known."""

    def __init__(self, registry: CollectorRegistry, *, dial: Histogram, tls: Histogram) -> None:
        self.counts = EndpointCounts()
        registry.register(self.counts)
        self.errors = _per_endpoint(
            registry,
            "aggregator_endpoint_errors",
            "Failed attempts per endpoint, by kind (connect, tls, timeout, reset, answer: a 502/503/504).",
            "kind",
        )
        self.retries = _per_endpoint(
            registry,
            "aggregator_endpoint_retries",
            "Requests retried on another endpoint after this one failed, by why they could be "
            "(unsent: never reached it; idempotent: a GET, HEAD or OPTIONS with no answer yet).",
            "reason",
        )
        self.ejections = _per_endpoint(
            registry,
            "aggregator_endpoint_ejections",
            "Endpoints ejected by passive outlier detection, by reason (unreachable, answers).",
            "reason",
        )
        self.ejected = Children(
            Gauge(
                "aggregator_endpoint_ejected",
                "1 while the endpoint is ejected (with --workers N: how many workers hold it ejected).",
                ["apiservice", "endpoint"],
                registry=registry,
            )
        )
        self.dial = Children(dial)
        self.tls = Children(tls)

    def dialed(self, name: str, endpoint: str, times: DialTimes) -> None:
        if times.tcp is not None:
            self.dial(name, endpoint).observe(times.tcp)
        if times.tls is not None:
            self.tls(name, endpoint).observe(times.tls)

    def ejection(self, name: str, endpoint: Endpoint, reason: str) -> None:
        """`Endpoints`' listener: an endpoint ejected (`reason`), or back (`reason` empty)."""
        authority = endpoint.authority
        if reason:
            kind = "answers" if reason.endswith(" answers") else "unreachable"
            self.ejections(name, authority, kind).inc()
            self.ejected(name, authority).set(1)
            log.warning(
                "endpoint ejected",
                extra=fields(
                    apiservice=name, endpoint=authority, reason=reason, ejections=endpoint.ejections
                ),
            )
        else:
            self.ejected(name, authority).set(0)
            log.info(
                "endpoint back after a successful probe", extra=fields(apiservice=name, endpoint=authority)
            )

    def forget(self, name: str, endpoint: str) -> None:
        """The endpoint left the Service (or the APIService is gone): its series go."""
        self.ejected.remove(name, endpoint)
        self.dial.remove(name, endpoint)
        self.tls.remove(name, endpoint)
        for kind in ("connect", "tls", "timeout", "reset", "answer"):
            self.errors.remove(name, endpoint, kind)
        for kind in (UNSENT, IDEMPOTENT):
            self.retries.remove(name, endpoint, kind)
        for kind in ("answers", "unreachable"):
            self.ejections.remove(name, endpoint, kind)
