"""What OpenAPI aggregation counts: downloads per source, document and outcome, and the merges of
the v2 document (how many, and how long the last one took)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aggregator.web.metrics import Families


class OpenAPIMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.fetches = family.counter(
            "aggregator_openapi_fetches",
            "OpenAPI downloads, by APIService (or kube-apiserver; a download shared by the APIServices of "
            "one Service counts for each), document (v2, v3) and outcome (ok, not_modified, not_found, "
            "error; moved: a document's hash moved, the index is read again).",
            ["apiservice", "document", "result"],
        )
        self.v2_merges = family.counter(
            "aggregator_openapi_v2_merges",
            "Times the merged OpenAPI v2 document was rebuilt (only when an input changed).",
        )
        self.v2_merge_duration = family.gauge(
            "aggregator_openapi_v2_merge_duration_seconds",
            "Seconds the last OpenAPI v2 merge took (merge, JSON, protobuf and gzip renderings).",
        )
