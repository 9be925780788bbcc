"""What discovery counts: fetches per source and outcome, when each source last answered, and how
often the aggregated document was rebuilt. A source is an APIService's name, or `kube-apiserver`
(`delegated.KUBE_APISERVER`) for kube-apiserver's own groups in kube mode.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aggregator.web.metrics import Families


class DiscoveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.fetches = family.counter(
            "aggregator_discovery_fetches",
            "Discovery fetches by source (an APIService name, or kube-apiserver in kube mode) and outcome "
            "(aggregated, not_modified, legacy, error).",
            ["apiservice", "result"],
        )
        self.last_success = family.gauge(
            "aggregator_discovery_last_success_timestamp_seconds",
            "Unix time of the last good discovery fetch, by source (APIService name or kube-apiserver).",
            ["apiservice"],
        )
        self.aggregations = family.counter(
            "aggregator_discovery_aggregation_count",
            "Times the aggregated discovery document was regenerated.",
        )
