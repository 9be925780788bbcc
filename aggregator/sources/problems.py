"""What the gateway did not load from `--apiservices-dir`, said where people look.

A manifest the gateway cannot load used to be a log line and nothing else: `kubectl get
apiservices` shows the objects that did load, and a file broken by a later edit keeps serving
what it held before, so nothing looks wrong. Each problem (a file that does not parse, an object
refused, a document of a kind the gateway does not read) is a `ManifestProblem`, and the folder's
problems are shown three ways: `aggregator check --all` names them and fails, `/readyz?verbose`
lists them as `warn:` lines (never a failed check: the rest of the folder is served, as
kube-apiserver keeps serving when one object is refused), and `aggregator_manifest_errors{file}`
counts them per file for an alert.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

UNREADABLE, REFUSED, SKIPPED = "unreadable", "refused", "skipped"

# The kinds the folder's readers take (files.py for the objects, auth/rbacfolder.py for RBAC,
# flowcontrol/sources.py for API Priority and Fairness).
READ_KINDS = (
    "APIService (apiregistration.k8s.io/v1), Service (v1), EndpointSlice (discovery.k8s.io/v1), Role, "
    "ClusterRole, RoleBinding and ClusterRoleBinding (rbac.authorization.k8s.io/v1), and FlowSchema and "
    "PriorityLevelConfiguration (flowcontrol.apiserver.k8s.io/v1)"
)


@dataclass(frozen=True, slots=True)
class ManifestProblem:
    """One thing of `path` the gateway did not load.

    `reason` is the cause as logged (a parse error names the file and line itself); `kept` counts
    what the gateway still serves from before the file broke (a refused object's previous version,
    or every object of a file that no longer parses).
    """

    path: Path
    what: str  # UNREADABLE, REFUSED or SKIPPED
    reason: str
    kept: int = 0

    def describe(self) -> str:
        """One line: the file, the cause, and what is served instead."""
        if self.what == UNREADABLE:
            cause = self.reason if self.reason.startswith(str(self.path)) else f"{self.path}: {self.reason}"
            if self.kept:
                held = "object" if self.kept == 1 else f"{self.kept} objects"
                return f"{cause} (file not loaded; the {held} it held before still served)"
            return f"{cause} (file not loaded)"
        if self.what == REFUSED:
            kept = "; its previous version still served" if self.kept else ""
            return f"{self.path}: {self.reason} (refused{kept})"
        return f"{self.path}: {self.reason} (skipped: the gateway reads only {READ_KINDS})"


Problems = Callable[[], Sequence[ManifestProblem]]


def merged_problems(*sources: Problems) -> Problems:
    """The problems of several readers of one folder (the objects', RBAC's), file by file."""

    def problems() -> list[ManifestProblem]:
        return sorted((p for source in sources for p in source()), key=lambda p: p.path)

    return problems


class ManifestReport:
    """The folder's problems as `/readyz?verbose` notes and as `aggregator_manifest_errors`.

    The metric is the gateway's own (kube-apiserver has no folder): a gauge per file with
    problems, its value how many; a file that loads again leaves the series, so an alert on
    `> 0` resolves by itself.
    """

    NAME = "aggregator_manifest_errors"
    HELP = (
        "Problems in each manifest file of --apiservices-dir that the gateway did not load: a file that "
        "does not parse, each object refused, each document of a kind it does not read. Files without "
        "problems have no series."
    )

    def __init__(self, problems: Problems, registry: CollectorRegistry) -> None:
        self._problems = problems
        registry.register(self)

    def notes(self) -> list[str]:
        """`warn:` lines for `/readyz?verbose`, one per problem."""
        return [f"warn: manifest {problem.describe()}" for problem in self._problems()]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["file"])
        for path, count in sorted(Counter(str(p.path) for p in self._problems()).items()):
            family.add_metric([path], count)
        yield family
