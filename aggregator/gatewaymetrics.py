"""Every feature's metrics, declared on one process's registry.

Each feature declares its own metrics in a small class taking the registry, beside the code that
records them; this is where the composition root (`assembly.py`) has them all declared, and each
component is handed its own feature's part, never this whole. They are declared whether or not
the feature runs in this mode (a local-mode gateway has no leader election, yet shows
`leader_election_master_status`), as upstream's components register theirs: a scrape always has
the same families, and dashboards and alerts find every series they read.

Each process has its own (no process-global registry): with `--workers N`, every worker declares
the same families and the control process merges them at scrape time (`workers/metrics.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from aggregator.audit.recorder import AuditMetrics
from aggregator.auth.metrics import AuthMetrics
from aggregator.availability.metrics import AvailabilityMetrics
from aggregator.availability.quarantine import QuarantineMetrics
from aggregator.backends.metrics import BackendMetrics
from aggregator.discovery.metrics import DiscoveryMetrics
from aggregator.leaderelection import LeaderElectionMetrics
from aggregator.openapi.metrics import OpenAPIMetrics
from aggregator.proxy.metrics import ProxyMetrics
from aggregator.sources.reflector import WatchMetrics
from aggregator.web.metrics import Metrics
from aggregator.web.pipeline import PipelineMetrics
from aggregator.web.requestmetrics import RequestMetrics


@dataclass(frozen=True)
class GatewayMetrics:
    # The registry, build info, the runtime collectors, certificate expiry and GET /metrics.
    exposition: Metrics
    apiserver: RequestMetrics  # kube-apiserver's apiserver_request_*
    pipeline: PipelineMetrics
    audit: AuditMetrics
    auth: AuthMetrics
    watches: WatchMetrics
    backends: BackendMetrics
    proxy: ProxyMetrics
    availability: AvailabilityMetrics
    quarantine: QuarantineMetrics
    leader_election: LeaderElectionMetrics
    discovery: DiscoveryMetrics
    openapi: OpenAPIMetrics

    @classmethod
    def declare(cls) -> GatewayMetrics:
        """A new registry with every feature's metrics declared on it."""
        exposition = Metrics()
        registry = exposition.registry
        backends = BackendMetrics(registry)
        return cls(
            exposition=exposition,
            apiserver=RequestMetrics(registry),
            pipeline=PipelineMetrics(registry),
            audit=AuditMetrics(registry),
            auth=AuthMetrics(registry),
            watches=WatchMetrics(registry),
            backends=backends,
            # The proxy counts aggregator_backend_errors_total too, and observes the dial and TLS
            # handshake histograms per endpoint: the backends declare them, the proxy is handed them.
            proxy=ProxyMetrics(registry, backends),
            availability=AvailabilityMetrics(registry),
            quarantine=QuarantineMetrics(registry),
            leader_election=LeaderElectionMetrics(registry),
            discovery=DiscoveryMetrics(registry),
            openapi=OpenAPIMetrics(registry),
        )

    @property
    def registry(self) -> CollectorRegistry:
        return self.exposition.registry
