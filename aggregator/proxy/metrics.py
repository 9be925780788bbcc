"""What the proxy counts: requests per APIService, verb and code, the time to the backend's answer,
and the requests it refuses (an APIService at its max-concurrent-requests, an upgrade it does not
tunnel); per endpoint, `endpointmetrics.py`.

`aggregator_backend_errors_total` is the backends' (`backends/metrics.py`): the proxy counts its
own failures to reach a backend there too, as do the gateway's own GETs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aggregator.backends.metrics import BackendMetrics
from aggregator.proxy.endpointmetrics import EndpointMetrics
from aggregator.web.metrics import LATENCY_BUCKETS, Families


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry, backends: BackendMetrics) -> None:
        family = Families(registry)
        self.requests = family.counter(
            "aggregator_proxy_requests",
            "Requests proxied to extension API servers, by APIService, verb and HTTP code.",
            ["apiservice", "verb", "code"],
        )
        self.duration = family.histogram(
            "aggregator_proxy_request_duration_seconds",
            "Time to the backend's response headers, by APIService and verb.",
            ["apiservice", "verb"],
            buckets=LATENCY_BUCKETS,
        )
        self.apiservice_rejected = family.counter(
            "aggregator_apiservice_rejected_requests",
            "Requests answered 429 because the APIService's max-concurrent-requests were in flight.",
            ["apiservice"],
        )
        self.upgrade_rejected = family.counter(
            "aggregator_upgrade_rejected",
            "Protocol upgrades not tunnelled, by reason (path: never on discovery/health/metrics; "
            "protocol: not SPDY/3.1 or websocket; body: the request carries a body; non101: the backend did "
            "not switch protocols).",
            ["reason"],
        )
        self.backend_errors = backends.errors
        # The endpoint label is `ip:port` of a ready endpoint (the cluster IP without
        # --enable-aggregator-routing), so a Service's series are as many as its endpoints.
        self.endpoints = EndpointMetrics(registry, dial=backends.dial, tls=backends.tls)
