"""What the gateway counts about reaching backends: failures by hop, insecure TLS settings, and how
long new connections take to dial and to shake hands.

`aggregator_backend_errors_total` is counted here (the gateway's own GETs: availability probes,
discovery and OpenAPI fetches) and by the proxy (`proxy/metrics.py` is handed it); the dial and
handshake histograms are observed per endpoint by the proxy, which knows the endpoint.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from aggregator.web.metrics import Families

# Connect and handshake phases: loopback and in-cluster ones take well under a millisecond.
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class BackendMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.errors = family.counter(
            "aggregator_backend_errors",
            "Failures reaching a backend, by APIService and kind (resolve, connect, tls, timeout, redirect).",
            ["apiservice", "kind"],
        )
        self.insecure = family.gauge(
            "aggregator_insecure_backends",
            "1 for each APIService proxied with insecureSkipTLSVerify.",
            ["apiservice"],
        )
        self.dial = _phase(
            family,
            "aggregator_endpoint_dial_duration_seconds",
            "TCP connect time of new connections, per endpoint.",
        )
        self.tls = _phase(
            family,
            "aggregator_endpoint_tls_handshake_duration_seconds",
            "TLS handshake time of new connections, per endpoint.",
        )


def _phase(family: Families, name: str, documentation: str) -> Histogram:
    """One phase of making a new connection, timed per APIService and endpoint."""
    return family.histogram(name, documentation, ["apiservice", "endpoint"], buckets=PHASE_BUCKETS)
