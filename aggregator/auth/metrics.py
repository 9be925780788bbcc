"""What authentication and authorization count: their caches' hits and misses, and the
TokenReview and SubjectAccessReview calls to kube-apiserver (latency, and how many are awaited)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from aggregator.web.metrics import LATENCY_BUCKETS


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.authn_cache = Counter(
            "aggregator_authentication_cache",
            "Token cache lookups by result (hit, miss).",
            ["result"],
            registry=registry,
        )
        self.authz_cache = Counter(
            "aggregator_authorization_cache",
            "SubjectAccessReview cache lookups by result (hit, miss).",
            ["result"],
            registry=registry,
        )
        self.review_duration = Histogram(
            "aggregator_webhook_review_duration_seconds",
            "Latency of TokenReview and SubjectAccessReview calls.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.reviews_in_flight = Gauge(
            "aggregator_webhook_reviews_in_flight",
            "Reviews awaiting kube-apiserver.",
            ["kind"],
            registry=registry,
        )
