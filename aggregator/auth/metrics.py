"""What authentication and authorization count: their caches' hits and misses, and the
TokenReview and SubjectAccessReview calls to kube-apiserver (latency, and how many are awaited)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aggregator.web.metrics import LATENCY_BUCKETS, Families


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.authn_cache = family.counter(
            "aggregator_authentication_cache", "Token cache lookups by result (hit, miss).", ["result"]
        )
        self.authz_cache = family.counter(
            "aggregator_authorization_cache",
            "SubjectAccessReview cache lookups by result (hit, miss).",
            ["result"],
        )
        self.review_duration = family.histogram(
            "aggregator_webhook_review_duration_seconds",
            "Latency of TokenReview and SubjectAccessReview calls.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
        )
        self.reviews_in_flight = family.gauge(
            "aggregator_webhook_reviews_in_flight", "Reviews awaiting kube-apiserver.", ["kind"]
        )
