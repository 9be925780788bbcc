"""What the control process and its workers tell each other (pickled frames, `channel.py`).

Control -> worker: `Hello` (once, after the runner's options: who the worker is), `State` (a
full snapshot first, then only what changed: a few verdicts, a note, a re-rendered document),
`ObjectChange` (each store event, in order; `StatusChange` for a status write of ours), `Collect` (a `/metrics` scrape wants this worker's
figures), `Scraped` (the group's figures for a scrape it
asked for). Worker -> control: `Suspect` (a proxied request failed: re-check the APIService now),
`Scrape`, `Collected`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.core import Metric

from aggregator.auth.authconfigmap import ClusterAuthentication
from aggregator.auth.rbac import RBACPolicy
from aggregator.model.apiservice import Condition
from aggregator.openapi.component import V2Published
from aggregator.openapi.documents import Document
from aggregator.sources.store import Kind, Obj

# (available, reason) as the control's availability checker last found; None: forgotten.
VerdictView = tuple[bool, str]
# A verbose line's place among the control's notes of one endpoint: (the source's position among
# that endpoint's note sources, then the section and subject of a `NoteBoard` line, or the line's
# position and "" for a source that gives whole lists). Lines read in key order.
NoteKey = tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """One of the control's health checks, mirrored by name in each worker."""

    name: str
    livez: bool
    readyz: bool


@dataclass(frozen=True, slots=True)
class Hello:
    """The worker's place in the group; it follows the `Options` the runner sent first
    (`runners/worker.py`), which this package does not know."""

    index: int  # 0..count-1, kept by a restarted worker
    count: int
    hop: str  # the group's one loop mark (`backends/hops.py`): a probe through any worker is a loop
    checks: tuple[HealthCheck, ...]


@dataclass(frozen=True, slots=True)
class AggregatedDocs:
    """The aggregated `/apis` document as rendered by the control: (body, ETag) per version."""

    legacy_only: bool  # kube-apiserver serves no aggregated discovery: `/apis` is legacy only
    documents: tuple[tuple[str, bytes, str], ...]  # (version, compact JSON, quoted ETag)


@dataclass(slots=True)
class State:
    """What changed since the last `State` (everything, in the first one). None: unchanged.

    A new field is something a worker mirrors: add it here, to `Publisher` (its snapshot and its
    change) and to `Replica._apply_state`; tests/workers/test_replica.py lists every field."""

    snapshot: bool = False
    objects: list[Obj] = field(default_factory=list)  # snapshot only
    revision: int = 0  # the control store's revision (snapshot only)
    synced: bool = False
    verdicts: dict[str, VerdictView | None] = field(default_factory=dict)
    health: dict[str, str | None] | None = None  # check name -> failure (None: passing)
    notes: dict[str, dict[NoteKey, str | None]] = field(
        default_factory=dict
    )  # endpoint -> lines (None: removed)
    discovery: AggregatedDocs | None = None
    openapi_v2: V2Published | None = None
    openapi_v3_index: Document | None = None
    openapi_v3: dict[str, Document | None] = field(default_factory=dict)  # None: removed
    cluster_auth: ClusterAuthentication | None = None
    rbac: RBACPolicy | None = None  # local mode: the folder's RBAC policy, compiled
    quarantined: frozenset[str] | None = None  # APIServices left out of discovery (legacy `/apis`)


@dataclass(frozen=True, slots=True)
class ObjectChange:
    """A store event, replayed in the worker with the control's revision."""

    kind: Kind
    obj: Obj | None  # the new object; None: deleted
    namespace: str
    name: str
    revision: int


@dataclass(frozen=True, slots=True)
class StatusChange:
    """A store event that changed only an APIService's conditions (a local-mode verdict written),
    replayed on the worker's copy: a few hundred bytes instead of the whole object, and the copy
    keeps sharing what it shared (its manifest, its caBundle) instead of a fresh copy of each."""

    name: str
    conditions: tuple[Condition, ...]
    resource_version: str
    revision: int


@dataclass(frozen=True, slots=True)
class Suspect:
    name: str


@dataclass(frozen=True, slots=True)
class Ejection:
    """A worker's proxy ejected an endpoint (`reason`), or took it back (`reason` empty)."""

    name: str
    endpoint: str
    reason: str


@dataclass(frozen=True, slots=True)
class Scrape:
    id: int


@dataclass(frozen=True, slots=True)
class Collect:
    id: int


@dataclass(frozen=True, slots=True)
class Collected:
    id: int
    families: list[Metric]


@dataclass(frozen=True, slots=True)
class Scraped:
    id: int
    families: list[Metric]


@dataclass(frozen=True, slots=True)
class Listening:
    """Worker -> control: the worker's listener is open (its start-up succeeded)."""

    pid: int


@dataclass(frozen=True, slots=True)
class AuditLines:
    """Worker -> control: encoded audit events, for the control's one writer of the audit log."""

    data: bytes
