"""`/metrics` of a process group: every process's figures merged into one exposition.

A scrape reaches one worker (through the Service), so that worker asks the control process, which
collects every worker's families over their channels and merges them with its own:
- counters, histograms and summaries are summed series by series: `apiserver_request_total` is
  the group's, as kube-apiserver's is its one process's;
- `*inflight*` / `*in_flight*` gauges are summed too (requests in flight in the group), and so
  are `aggregator_endpoint_ejected` (each worker ejects on its own: how many hold it ejected) and
  API Priority and Fairness's requests and seats executing and in queue (`apiserver_flowcontrol_current_*`,
  `apiserver_current_inqueue_requests`: each worker queues and executes its own);
- `process_*` series, gauges and counters alike (CPU seconds, memory, file descriptors, start
  time), are per process: one series per process with a `worker` label (`control`, or the
  worker's index), so the CPU of each process shows, not one sum that hides a worker at 100%;
- every other gauge is a fact every process computes alike (build info, certificate expiry) or
  that only the control sets (availability, leader election, discovery freshness): the control's
  series when it has one, else the lowest worker's.

prometheus_client's multiprocess mode was the alternative: it needs a shared folder of mmap files
and an environment variable set before import, changes every metric's storage, and cannot express
the custom collectors (`aggregator_unavailable_apiservice`, certificate expiry); collecting over
the channels the group already has keeps one registry per process, as today.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from aggregator.web.metrics import Families

SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
CONTROL = "control"
WORKER_LABEL = "worker"


def _summed(metric: Metric) -> bool:
    return (
        metric.type in SUMMED_TYPES
        or "inflight" in metric.name
        or "in_flight" in metric.name
        or "inqueue" in metric.name
        or metric.name.startswith("apiserver_flowcontrol_current_executing_")
        or metric.name == "apiserver_flowcontrol_request_concurrency_in_use"
        or metric.name.endswith("_ejected")
    )


def _per_process(metric: Metric) -> bool:
    return metric.name.startswith("process_")


def merge(sources: Sequence[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """Families of every process (`(worker label, families)`, the control first), merged."""
    out: dict[str, Metric] = {}
    index: dict[tuple[str, str, tuple[tuple[str, str], ...]], int] = {}
    for source, families in sources:
        for metric in families:
            merged = out.get(metric.name)
            if merged is None:
                merged = out[metric.name] = Metric(
                    metric.name, metric.documentation, metric.type, metric.unit
                )
            summed, per_process = _summed(metric), _per_process(metric)
            for sample in metric.samples:
                if per_process:  # before `summed`: process_cpu_seconds_total is a counter
                    merged.samples.append(sample._replace(labels={**sample.labels, WORKER_LABEL: source}))
                    continue
                key = (metric.name, sample.name, tuple(sorted(sample.labels.items())))
                at = index.get(key)
                if at is None:
                    index[key] = len(merged.samples)
                    merged.samples.append(sample)
                elif summed:
                    previous = merged.samples[at]
                    merged.samples[at] = previous._replace(value=previous.value + sample.value)
    return list(out.values())


class Merged:
    """A registry-shaped view of merged families, for prometheus_client's encoders."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class WorkerMetrics:
    """The supervisor's own figures: how many workers, and how often each was restarted."""

    def __init__(self, count: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        family = Families(self.registry)
        self.workers = family.gauge("aggregator_workers", "Worker processes serving the port (--workers).")
        self.workers.set(count)
        self.restarts = family.counter(
            "aggregator_worker_restarts",
            "Worker processes restarted after they died, by worker index.",
            [WORKER_LABEL],
        )
        for worker in range(count):
            self.restarts.labels(str(worker))
