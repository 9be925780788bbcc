"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's `tools/leaderelection` does it.

Every replica runs one `LeaderElector`; only the one holding the Lease does the guarded work
(writing APIService status), the others keep serving. The algorithm is client-go's
`LeaderElector.tryAcquireOrRenew` (leaderelection.go) over a `LeaseLock` (resourcelock/leaselock.go):

- a candidate GETs the Lease and CREATEs it on NotFound; it takes a held Lease over (an UPDATE
  with `leaseTransitions + 1`) only when `holderIdentity` is empty (released) or the Lease has not
  changed for `leaseDurationSeconds`, counted on this replica's clock from when it *observed* the
  last change (`isLeaseValid`), never from `renewTime`: clock skew between nodes does not matter;
- the leader renews with an UPDATE that keeps `acquireTime` and `leaseTransitions`, first on the
  Lease it last saw (the fast path), else after a fresh GET (the slow path);
- every UPDATE carries the resourceVersion last read, so of two writers one gets a 409 Conflict
  and simply fails that attempt;
- acquiring is retried every RetryPeriod, jittered by JitterFactor (`wait.JitterUntil`); renewing
  every RetryPeriod until RenewDeadline passes without success, and then leadership is lost;
- stopping releases the Lease (`ReleaseOnCancel`: holder "", leaseDurationSeconds 1), so another
  replica takes over at its next retry instead of a whole lease duration later.

Where this differs from client-go, it is because a gateway keeps serving after losing the Lease:
- after losing leadership it steps down and campaigns again (kube-controller-manager exits);
- it notices a renewal by comparing the Lease's times to the microsecond: client-go compares
  `json.Marshal(LeaderElectionRecord)`, whose `metav1.Time` fields keep whole seconds, so with a
  sub-second RetryPeriod it can miss renewals and take a live leader's Lease (with the default 2s
  every renewal lands in a new second and both behave the same);
- a release first checks that the Lease still names this replica (client-go trusts what it last saw).

Like client-go's, this is not fencing: a leader stalled past the lease duration may still finish a
write it began while it led.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
from prometheus_client import CollectorRegistry

from aggregator.kube import calls
from aggregator.model.decode import field as decode_field
from aggregator.sources.options import SourceConfig
from aggregator.util.flags import ConfigError, FlagSet, GoBool, GoDuration, Problems
from aggregator.util.logs import fields
from aggregator.web.metrics import Families

log = logging.getLogger(__name__)

# kube-controller-manager's HealthzAdaptor timeout: how long past the lease duration a leader that
# has not renewed still counts as healthy (controllermanager.go `NewLeaderHealthzAdaptor(20s)`).
MAX_TOLERABLE_EXPIRED_LEASE = 20.0
# client-go's HealthzAdaptor.Name().
CHECK_NAME = "leaderElection"
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

LeadershipListener = Callable[[bool], None]
# client-go leaderelection.go `JitterFactor`: acquire retries wait RetryPeriod * [1, 2.2).
JITTER_FACTOR = 1.2
# The only lock type client-go still has (resourcelock/interface.go).
LEASES_LOCK = "leases"
_REMOVED_LOCKS = {
    "endpoints": "endpoints lock is removed, migrate to leases",
    "configmaps": "configmaps lock is removed, migrate to leases",
    "endpointsleases": "endpointsleases lock is removed, migrate to leases",
    "configmapsleases": "configmapsleases lock is removed, migrated to leases",
}


# --- configuration -------------------------------------------------------------------------------


@dataclass
class LeaderElectionOptions:
    """component-base's `LeaderElectionConfiguration` and `BindLeaderElectionFlags`, with
    kube-controller-manager's defaults."""

    leader_elect: bool = True
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resource_lock: str = LEASES_LOCK
    resource_name: str = "aggregator"
    # "" = this pod's namespace (`lease_namespace`)
    resource_namespace: str = ""

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "leader election", prefix)
        flags.add(
            "--leader-elect",
            field="leader_elect",
            action=GoBool,
            default=argparse.SUPPRESS,  # true; absent unless given (a kube-mode-only flag)
            help="with --write-apiservice-status, elect one replica through a coordination.k8s.io Lease and "
            "write status only from it, so every replica can run with the flag (default true). With "
            "--leader-elect=false every replica that has the flag writes.",
        )
        flags.add(
            "--leader-elect-lease-duration",
            field="lease_duration",
            action=GoDuration,
            default=15.0,
            help="the duration that non-leader candidates will wait after observing a leadership renewal "
            "until attempting to acquire leadership of a led but unrenewed leader slot: effectively the "
            "longest a stopped leader goes unreplaced (default 15s).",
        )
        flags.add(
            "--leader-elect-renew-deadline",
            field="renew_deadline",
            action=GoDuration,
            default=10.0,
            help="the interval between attempts by the acting leader to renew a leadership slot before it "
            "stops leading; must be less than the lease duration (default 10s).",
        )
        flags.add(
            "--leader-elect-retry-period",
            field="retry_period",
            action=GoDuration,
            default=2.0,
            help="the duration the clients should wait between attempting acquisition and renewal of a "
            "leadership (default 2s).",
        )
        flags.add(
            "--leader-elect-resource-lock",
            field="resource_lock",
            default="leases",
            help="the type of resource object that is used for locking during leader election. Supported "
            "options are 'leases' (default).",
        )
        flags.add(
            "--leader-elect-resource-name",
            field="resource_name",
            default="aggregator",
            help="the name of the Lease used for locking during leader election (default aggregator).",
        )
        flags.add(
            "--leader-elect-resource-namespace",
            field="resource_namespace",
            default="",
            help="the namespace of the Lease (default: the pod's own namespace, from POD_NAMESPACE or the "
            "service account, else default).",
        )

    def validate(self) -> list[ConfigError]:
        """Upstream's refusals, in the order kube-controller-manager meets them: the configuration
        (component-base), the lock type (client-go `resourcelock.New`), the durations
        (`NewLeaderElector`). Nothing to check when the election is off."""
        problems = Problems()
        if not self.leader_elect:
            return problems.errors
        problem = timing_problem(self.lease_duration, self.renew_deadline, self.retry_period)
        if problem is not None and problem[1] == "must be greater than zero":
            problems.add(f"--leader-elect-{problem[0]}", problem[1])
        if not self.resource_name:
            problems.add("--leader-elect-resource-name", "Required value")
        lock = lock_problem(self.resource_lock)
        if lock is not None:
            problems.add("--leader-elect-resource-lock", lock)
        if problem is not None and problem[1] != "must be greater than zero":
            problems.add(f"--leader-elect-{problem[0]}", problem[1])
        return problems.errors

    def apply_to(self, config: LeaderElectionTarget) -> None:
        """After the source's and the availability group's: only kube mode's status writes elect a
        writer. The Lease's namespace is resolved here, once."""
        elect = self.leader_elect and config.source.kube_mode and config.write_apiservice_status
        config.leader_election = (
            LeaderElectionConfig(
                namespace=lease_namespace(self.resource_namespace),
                name=self.resource_name,
                lease_duration=self.lease_duration,
                renew_deadline=self.renew_deadline,
                retry_period=self.retry_period,
            )
            if elect
            else None
        )


@dataclass(frozen=True)
class LeaderElectionConfig:
    """The Lease that elects the one replica writing APIService status."""

    namespace: str
    name: str = "aggregator"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElectionTarget(Protocol):
    @property
    def source(self) -> SourceConfig: ...

    @property
    def write_apiservice_status(self) -> bool: ...

    leader_election: LeaderElectionConfig | None


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def timing_problem(
    lease_duration: float, renew_deadline: float, retry_period: float
) -> tuple[str, str] | None:
    """(which duration, why) for the first reason upstream refuses these durations, else None.

    Zero or negative first (component-base `ValidateLeaderElectionConfiguration`), then
    client-go's `NewLeaderElector`, compared in nanoseconds as Go's time.Duration is.
    """
    for which, value in (
        ("lease-duration", lease_duration),
        ("renew-deadline", renew_deadline),
        ("retry-period", retry_period),
    ):
        if _ns(value) <= 0:
            return which, "must be greater than zero"
    if _ns(lease_duration) <= _ns(renew_deadline):
        return "lease-duration", "leaseDuration must be greater than renewDeadline"
    if _ns(renew_deadline) <= int(JITTER_FACTOR * _ns(retry_period)):
        return "renew-deadline", "renewDeadline must be greater than retryPeriod*JitterFactor"
    return None


def lock_problem(lock_type: str) -> str | None:
    """client-go resourcelock `new`'s error for a lock type other than `leases`, else None."""
    if lock_type == LEASES_LOCK:
        return None
    return _REMOVED_LOCKS.get(lock_type, f"Invalid lock-type {lock_type}; possible values: {LEASES_LOCK}")


def default_identity() -> str:
    """kube-controller-manager's identity: `os.Hostname() + "_" + uuid` (controllermanager.go `Run`).

    The hostname (the pod name) says who leads; the UUID keeps a restarted pod from passing for
    its previous self, which would renew a lease it never acquired.
    """
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def lease_namespace(
    flag: str,
    *,
    environ: Mapping[str, str] | None = None,
    namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE,
) -> str:
    """Where the Lease lives: the flag, else this pod's namespace, else `default`.

    The pod's namespace is resolved as client-go's `inClusterClientConfig.Namespace` does
    (POD_NAMESPACE, then the service account's namespace file), so the Lease sits next to the
    Deployment whose replicas elect, and a namespace-scoped Role there can grant it.
    """
    if flag:
        return flag
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        text = namespace_file.read_text().strip()
        if text:
            return text
    return "default"


class LeaderElectionMetrics:
    """client-go's leader election metrics as component-base registers them, with upstream's names
    and help text (metrics/prometheus/clientgo/leaderelection/metrics.go)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.master_status = family.gauge(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease. Please make sure to group "
            "by name.",
            ["name"],
        )
        self.slowpath = family.counter(
            "leader_election_slowpath",
            "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string "
            "used to identify the lease. Please make sure to group by name.",
            ["name"],
        )


def elector_for(config: LeaderElectionConfig, api: LeaseAPI, metrics: LeaderElectionMetrics) -> LeaderElector:
    """The `--leader-elect-*` flags as an elector (validated already by `LeaderElectionOptions.validate`)."""
    return LeaderElector(
        api,
        metrics,
        namespace=config.namespace,
        name=config.name,
        lease_duration=config.lease_duration,
        renew_deadline=config.renew_deadline,
        retry_period=config.retry_period,
    )


# --- the record and the Lease holding it -----------------------------------------------------------


def micro_time(now: dt.datetime | None = None) -> str:
    """metav1.MicroTime on the wire: RFC 3339 in UTC with exactly 6 fractional digits."""
    return (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class ElectionRecord:
    """client-go's `LeaderElectionRecord`, the part of a Lease's spec the election reads and writes.

    Times stay the strings kube-apiserver serves (None for an absent one): they are only compared
    and copied, never used as a clock.
    """

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    leader_transitions: int = 0
    strategy: str = ""
    preferred_holder: str = ""

    @classmethod
    def from_lease_spec(cls, spec: Any) -> ElectionRecord:
        """`LeaseSpecToLeaderElectionRecord`; a field of the wrong type raises ValueError."""
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise ValueError("lease spec is not an object")

        def text(key: str) -> str:
            value: str = decode_field(spec, key, str, f"lease spec.{key}", "")
            return value

        def number(key: str) -> int:
            value: int = decode_field(spec, key, int, f"lease spec.{key}", 0)
            return value

        return cls(
            holder_identity=text("holderIdentity"),
            lease_duration_seconds=number("leaseDurationSeconds"),
            acquire_time=text("acquireTime") or None,
            renew_time=text("renewTime") or None,
            leader_transitions=number("leaseTransitions"),
            strategy=text("strategy"),
            preferred_holder=text("preferredHolder"),
        )

    def to_lease_spec(self) -> dict[str, Any]:
        """`LeaderElectionRecordToLeaseSpec`: holder, duration, both times and transitions always."""
        spec: dict[str, Any] = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.leader_transitions,
        }
        if self.preferred_holder:
            spec["preferredHolder"] = self.preferred_holder
        if self.strategy:
            spec["strategy"] = self.strategy
        return spec


class LeaseResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...


class LeaseAPI(Protocol):
    """What the lock needs from `KubeClient`: declared calls with a per-request timeout."""

    async def request(
        self,
        call: calls.ApiCall,
        *,
        namespace: str | None = None,
        name: str | None = None,
        json_body: Any = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> LeaseResponse: ...


class LockError(Exception):
    """A Lease call kube-apiserver refused (or that did not get an answer: status 0)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def is_conflict(self) -> bool:
        """apimachinery `errors.IsConflict`: reason Conflict (not AlreadyExists, also a 409)."""
        return self.reason == "Conflict"


def _decode(response: LeaseResponse) -> dict[str, Any] | None:
    try:
        doc = json.loads(response.body)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _failure(call: calls.ApiCall, response: LeaseResponse) -> LockError:
    """The error client-go would build: the Status's reason, or one derived from the code."""
    doc = _decode(response) or {}
    reason = str(doc.get("reason") or {404: "NotFound", 409: "Conflict"}.get(response.status, ""))
    message = str(doc.get("message") or response.body[:200].decode("utf-8", "replace"))
    return LockError(f"{call}: HTTP {response.status} {reason}: {message}", response.status, reason)


class LeaseLock:
    """client-go's `LeaseLock`: one named Lease, and the latest version of it seen here.

    Update sends that version back whole with a new spec, so its resourceVersion makes the write
    conditional. Requests time out after max(1s, RenewDeadline/2), as `NewFromKubeconfig` sets,
    so one hung request cannot use up the renew deadline.
    """

    def __init__(self, api: LeaseAPI, namespace: str, name: str, *, renew_deadline: float) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, renew_deadline / 2))
        self._lease: dict[str, Any] | None = None

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def _call(self, call: calls.ApiCall, body: Any = None, *, named: bool = True) -> dict[str, Any]:
        response = await self.api.request(
            call,
            namespace=self.namespace,
            name=self.name if named else None,
            json_body=body,
            client_timeout=self.timeout,
        )
        if not 200 <= response.status < 300:
            raise _failure(call, response)
        doc = _decode(response)
        if doc is None:
            raise LockError(f"{call}: the response is not a JSON object", response.status)
        return doc

    async def get(self) -> ElectionRecord | None:
        """The record, or None when the Lease does not exist (NotFound)."""
        try:
            lease = await self._call(calls.GET_LEASES)
        except LockError as err:
            if err.status == 404:
                return None
            raise
        record = ElectionRecord.from_lease_spec(lease.get("spec"))
        self._lease = lease
        return record

    async def create(self, record: ElectionRecord) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_lease_spec(),
        }
        self._lease = await self._call(calls.CREATE_LEASES, body, named=False)

    async def update(self, record: ElectionRecord) -> None:
        if self._lease is None:
            raise LockError("lease not initialized, call get or create first")
        body = dict(self._lease)
        body["spec"] = record.to_lease_spec()
        self._lease = await self._call(calls.UPDATE_LEASES, body)


# --- the elector ---------------------------------------------------------------------------------


class LeaderElector:
    """Campaigns for one Lease until stopped; `is_leader` says whether this replica holds it now.

    A gateway component: `start()` begins campaigning in the background, `stop()` ends it and
    releases the Lease if held. Listeners hear `True` on becoming leader and `False` on losing it.
    Whether it leads is also `leader_election_master_status{name}` (component-base's gauge) and
    the `leaderElection` health check's verbose notes.
    """

    def __init__(
        self,
        api: LeaseAPI,
        metrics: LeaderElectionMetrics,
        *,
        namespace: str,
        name: str = "aggregator",
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        identity: str | None = None,
        release_on_cancel: bool = True,
        rng: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        problem = timing_problem(lease_duration, renew_deadline, retry_period)
        if problem is not None:
            raise ValueError(problem[1])
        self.identity = default_identity() if identity is None else identity
        if not self.identity:
            raise ValueError("Lock identity is empty")
        if not namespace or not name:
            raise ValueError("the lease needs a namespace and a name")
        self.lock = LeaseLock(api, namespace, name, renew_deadline=renew_deadline)
        self.name = name
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self._metrics = metrics
        self._rng = rng or random.Random().random
        # client-go's `clock`: observed times and validity, monotonic like Go's time.Now readings.
        self._clock = clock
        self._listeners: list[LeadershipListener] = []
        self._task: asyncio.Task[None] | None = None
        self._leading = False
        # client-go's observedRecord / observedTime / observedRawRecord / reportedLeader.
        self._observed = ElectionRecord()
        self._observed_time = 0.0
        self._observed_raw: ElectionRecord | None = None
        self._reported_leader = ""
        metrics.master_status.labels(name).set(0)

    # --- what the rest of the gateway asks ----------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True from acquiring the Lease until a renewal fails or `stop()`."""
        return self._leading

    @property
    def leader(self) -> str:
        """The last holder observed (`GetLeader`); "" when none yet, or after a release."""
        return self._observed.holder_identity

    def add_listener(self, listener: LeadershipListener) -> None:
        self._listeners.append(listener)

    def check(self) -> str | None:
        """client-go `LeaderElector.Check` behind its `HealthzAdaptor`: a follower is always fine;
        a leader fails only when it has not renewed for lease duration + 20s (a stuck loop)."""
        if not self._leading:
            return None
        if self._clock() - self._observed_time > self.lease_duration + MAX_TOLERABLE_EXPIRED_LEASE:
            return f"failed election to renew leadership on lease {self.name}"
        return None

    def notes(self) -> list[str]:
        """The verbose health lines saying who leads: leading never decides readiness."""
        lease = self.lock.describe()
        if self._leading:
            return [f"info: {CHECK_NAME}: leading lease {lease} as {self.identity}"]
        holder = self._observed.holder_identity
        if not holder:
            held = "no holder seen"
        elif holder == self.identity:
            held = "renewal failed; campaigning again"
        else:
            held = f"held by {holder}"
        return [f"info: {CHECK_NAME}: not leading lease {lease} ({held})"]

    # --- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leader-election {self.lock.describe()}")

    async def stop(self) -> None:
        """Stop campaigning; with ReleaseOnCancel, free the Lease for the other replicas at once."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Stop leading before the Lease is freed, so no guarded work overlaps the next leader's.
        self._set_leading(False)
        if self.release_on_cancel:
            await self._release()

    async def _run(self) -> None:
        """client-go `Run`, repeated: acquire, renew until that fails, release, campaign again."""
        while True:
            try:
                await self._acquire()
                await self._renew()
                if self.release_on_cancel:
                    await self._release()
            except Exception:
                log.exception("leader election failed; retrying", extra=fields(lock=self.lock.describe()))
                self._set_leading(False)
                await asyncio.sleep(self.retry_period)

    async def _acquire(self) -> None:
        """client-go `acquire`: try at once, then every RetryPeriod * [1, 1 + JitterFactor)."""
        desc = self.lock.describe()
        log.info("attempting to acquire leader lease", extra=fields(lock=desc, identity=self.identity))
        while True:
            succeeded = await self._try_acquire_or_renew()
            self._maybe_report_transition()
            if succeeded:
                break
            log.debug("failed to acquire lease", extra=fields(lock=desc))
            await asyncio.sleep(self.retry_period + self._rng() * JITTER_FACTOR * self.retry_period)
        self._set_leading(True)
        log.info("successfully acquired lease", extra=fields(lock=desc, identity=self.identity))

    async def _renew(self) -> None:
        """client-go `renew`: every RetryPeriod, retry until one renewal succeeds or RenewDeadline
        passes (`wait.PollUntilContextTimeout`, immediate); a missed deadline loses leadership."""
        desc = self.lock.describe()
        while True:
            try:
                async with asyncio.timeout(self.renew_deadline):
                    while True:
                        if await self._try_acquire_or_renew():
                            break
                        await asyncio.sleep(self.retry_period)
            except TimeoutError:
                self._maybe_report_transition()
                self._set_leading(False)
                log.info(
                    "failed to renew lease; no longer leading",
                    extra=fields(lock=desc, reason=f"not renewed within {self.renew_deadline:g}s"),
                )
                return
            self._maybe_report_transition()
            log.debug("successfully renewed lease", extra=fields(lock=desc))
            await asyncio.sleep(self.retry_period)

    async def _try_acquire_or_renew(self) -> bool:
        """client-go `tryAcquireOrRenew`, step for step; True when this replica now holds the Lease."""
        wall, now = micro_time(), self._clock()
        record = ElectionRecord(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.lease_duration),  # Go: int(LeaseDuration / time.Second)
            acquire_time=wall,
            renew_time=wall,
        )
        desc = self.lock.describe()

        # 1. Fast path: the leader updates the Lease it last saw, assuming nobody wrote since.
        if self._holds_record() and self._lease_valid(now):
            fast = replace(
                record,
                acquire_time=self._observed.acquire_time,
                leader_transitions=self._observed.leader_transitions,
            )
            try:
                await self.lock.update(fast)
            except Exception as err:
                log.debug(
                    "failed to update lease optimistically, falling back to slow path",
                    extra=fields(lock=desc, reason=str(err)),
                )
            else:
                self._set_observed(fast)
                return True

        # 2. Obtain or create the record.
        old = await self._get_record(desc)
        if old is False:
            return False
        if old is None:
            try:
                await self.lock.create(record)
            except Exception as err:
                log.warning(
                    "error initially creating lease lock", extra=fields(lock=desc, reason=_describe(err))
                )
                return False
            self._set_observed(record)
            return True

        # 3. Record obtained: note any change, and keep off a Lease that is held and not expired.
        if self._observed_raw != old:
            self._set_observed(old)
            self._observed_raw = old
        if old.holder_identity and self._lease_valid(now) and not self._holds_record():
            log.debug(
                "lease is held and has not yet expired", extra=fields(lock=desc, holder=old.holder_identity)
            )
            return False

        # 4. Renew (keeping acquireTime and transitions) or take over (one more transition).
        if self._holds_record():
            record = replace(record, acquire_time=old.acquire_time, leader_transitions=old.leader_transitions)
            self._metrics.slowpath.labels(self.name).inc()
        else:
            record = replace(record, leader_transitions=old.leader_transitions + 1)
        try:
            await self.lock.update(record)
        except Exception as err:
            log.warning("failed to update lease", extra=fields(lock=desc, reason=_describe(err)))
            return False
        self._set_observed(record)
        return True

    async def _release(self) -> bool:
        """client-go `release`: `tryRelease` within RenewDeadline."""
        try:
            async with asyncio.timeout(self.renew_deadline):
                return await self._try_release()
        except TimeoutError:
            log.warning(
                "failed to release lease", extra=fields(lock=self.lock.describe(), reason="timed out")
            )
            return False

    async def _try_release(self) -> bool:
        """client-go `tryRelease`: write holder "", leaseDurationSeconds 1, times now; a conflict
        (a renewal racing the stop) is retried."""
        desc = self.lock.describe()
        while True:
            old = await self._get_record(desc)
            if old is False:
                return False
            if old is None:
                log.info("lease lock not found", extra=fields(lock=desc))
                return False
            if not self._holds_record() or old.holder_identity != self.identity:
                return True
            wall = micro_time()
            released = ElectionRecord(
                lease_duration_seconds=1,
                acquire_time=wall,
                renew_time=wall,
                leader_transitions=old.leader_transitions,
            )
            try:
                await self.lock.update(released)
            except LockError as err:
                if err.is_conflict:
                    log.debug("conflict when releasing lease, retrying", extra=fields(lock=desc))
                    continue
                log.warning("failed to release lease", extra=fields(lock=desc, reason=str(err)))
                return False
            except Exception as err:
                log.warning("failed to release lease", extra=fields(lock=desc, reason=_describe(err)))
                return False
            self._set_observed(released)
            log.info("released lease", extra=fields(lock=desc))
            return True

    async def _get_record(self, desc: str) -> ElectionRecord | Literal[False] | None:
        """The Lease's record (None: there is no Lease), or False once the failure to read it is
        logged (acquiring, renewing and releasing all give up for this round then)."""
        try:
            return await self.lock.get()
        except Exception as err:
            log.warning("error retrieving lease lock", extra=fields(lock=desc, reason=_describe(err)))
            return False

    # --- bookkeeping ----------------------------------------------------------------------------------

    def _holds_record(self) -> bool:
        """client-go `IsLeader`: the last record observed names this replica."""
        return self._observed.holder_identity == self.identity

    def _lease_valid(self, now: float) -> bool:
        """client-go `isLeaseValid`: observed time + the Lease's own leaseDurationSeconds."""
        return self._observed_time + self._observed.lease_duration_seconds > now

    def _set_observed(self, record: ElectionRecord) -> None:
        self._observed = record
        self._observed_time = self._clock()

    def _maybe_report_transition(self) -> None:
        holder = self._observed.holder_identity
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        if holder:
            log.info("new leader observed", extra=fields(lock=self.lock.describe(), leader=holder))

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self._metrics.master_status.labels(self.name).set(1 if leading else 0)
        for listener in list(self._listeners):
            try:
                listener(leading)
            except Exception:
                log.exception("leadership listener failed", extra=fields(lock=self.lock.describe()))


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__
