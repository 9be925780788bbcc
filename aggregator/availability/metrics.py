"""kube-aggregator's availability metrics, with upstream's names, labels and help text.

`aggregator_unavailable_apiservice{name}` and `aggregator_unavailable_apiservice_total{name,reason}`
as kube-aggregator's status controller declares them (pkg/controllers/status,
`newAvailabilityMetrics`): the checker sets the gauge on every verdict and counts a recorded flip to
not-available. (The discovery quarantine's gauge is declared in `quarantine.py`.)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from aggregator.web.metrics import Families


class UnavailableGauge:
    """`aggregator_unavailable_apiservice{name}`: a custom collector, as upstream's is.

    It shares its family name with the `aggregator_unavailable_apiservice_total` counter, which a
    standard Gauge could not (the registry would refuse the duplicate name).
    """

    HELP = "[ALPHA] Gauge of APIServices which are marked as unavailable broken down by APIService name."

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def set(self, name: str, unavailable: bool) -> None:
        self._values[name] = 1.0 if unavailable else 0.0

    def forget(self, name: str) -> None:
        self._values.pop(name, None)

    def value(self, name: str) -> float | None:
        return self._values.get(name)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("aggregator_unavailable_apiservice", self.HELP, labels=["name"])
        for name, value in sorted(self._values.items()):
            family.add_metric([name], value)
        yield family


class AvailabilityMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.unavailable = UnavailableGauge()
        registry.register(self.unavailable)
        self.unavailable_total = Families(registry).counter(
            "aggregator_unavailable_apiservice",
            "[ALPHA] Counter of APIServices which are marked as unavailable broken down by APIService name "
            "and reason.",
            ["name", "reason"],
        )
