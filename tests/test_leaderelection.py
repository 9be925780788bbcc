"""Leader election over a Lease in the fake kube-apiserver, as replicas of the gateway run it.

Durations are short (lease 1s, renew deadline 0.6s, retry 0.2s: the smallest that still pass
upstream's validation with a whole-second lease), and every wait is for a condition.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypedDict

import pytest
from prometheus_client import CollectorRegistry

from aggregator.commands.cli import build_parser
from aggregator.config import options_from_args, validate
from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.leaderelection import (
    CHECK_NAME,
    ElectionRecord,
    LeaderElectionMetrics,
    LeaderElector,
    LeaseLock,
    LockError,
    default_identity,
    lease_namespace,
)
from aggregator.util.flags import ConfigError
from tests.support.fakekube import FakeKube
from tests.support.polling import until

NAMESPACE = "aggregator-system"
NAME = "aggregator"


class Timings(TypedDict):
    """LeaderElector's three timing keywords, so `**FAST` type-checks against its signature."""

    lease_duration: float
    renew_deadline: float
    retry_period: float


FAST: Timings = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.2}
# The longest a candidate waits between tries: RetryPeriod * (1 + JitterFactor).
MAX_RETRY_WAIT = 0.2 * 2.2
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def lease(fake: FakeKube) -> dict[str, Any]:
    obj = fake.get_object("leases", NAME, NAMESPACE)
    assert obj is not None, "no lease"
    return obj


def spec(fake: FakeKube) -> dict[str, Any]:
    return dict(lease(fake)["spec"])


def leader_status(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("leader_election_master_status", {"name": NAME})


class Replica:
    """One elector with its own metrics, and every leadership change it reported, timed."""

    def __init__(self, client: KubeClient, identity: str, **overrides: Any) -> None:
        self.registry = CollectorRegistry()
        self.elector = LeaderElector(
            client,
            LeaderElectionMetrics(self.registry),
            namespace=NAMESPACE,
            name=NAME,
            identity=identity,
            **{**FAST, **overrides},
        )
        self.events: list[tuple[bool, float]] = []
        self.elector.add_listener(lambda leading: self.events.append((leading, time.monotonic())))

    @property
    def leading(self) -> bool:
        return self.elector.is_leader

    def became_leader_at(self) -> float:
        return next(at for leading, at in self.events if leading)


@pytest.fixture
async def client(fake_kube: FakeKube) -> AsyncIterator[KubeClient]:
    assert fake_kube.kubeconfig is not None
    kube = KubeClient.from_kubeconfig(str(fake_kube.kubeconfig))
    await kube.start()
    yield kube
    await kube.stop()


@pytest.fixture
async def replicas(client: KubeClient) -> AsyncIterator[Callable[..., Any]]:
    """`await replicas(identity, **elector_options)`: a started Replica, stopped after the test."""
    async with AsyncExitStack() as stack:

        async def start(identity: str, **overrides: Any) -> Replica:
            replica = Replica(client, identity, **overrides)
            await replica.elector.start()
            stack.push_async_callback(replica.elector.stop)
            return replica

        yield start


# --- electing ----------------------------------------------------------------------------------------


async def test_of_two_replicas_exactly_one_leads_and_keeps_renewing(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    a = await replicas("replica-a")
    await until(lambda: a.leading)
    b = await replicas("replica-b")

    # The first one created the Lease as upstream's LeaseLock writes it.
    first = spec(fake_kube)
    assert first["holderIdentity"] == "replica-a"
    assert (first["leaseDurationSeconds"], first["leaseTransitions"]) == (1, 0)
    assert MICRO_TIME.fullmatch(first["acquireTime"]) and MICRO_TIME.fullmatch(first["renewTime"])
    # (renewed already: client-go's renew loop polls immediately after acquiring)
    assert first["acquireTime"] <= first["renewTime"]

    # Several renewals later: same holder, acquireTime and transitions kept, renewTime moving,
    # and the other replica looked many times without ever leading or writing.
    renew_times = {first["renewTime"]}
    gets_before = fake_kube.counts[("get", "leases")]

    def renewed_often() -> bool:
        renew_times.add(spec(fake_kube)["renewTime"])
        return len(renew_times) >= 8 and fake_kube.counts[("get", "leases")] >= gets_before + 5

    await until(renewed_often)
    now = spec(fake_kube)
    assert now["holderIdentity"] == "replica-a"
    assert (now["acquireTime"], now["leaseTransitions"]) == (first["acquireTime"], 0)
    assert a.events == [(True, a.became_leader_at())] and b.events == []
    assert (a.leading, b.leading) == (True, False)
    assert (leader_status(a.registry), leader_status(b.registry)) == (1.0, 0.0)
    assert fake_kube.counts[("create", "leases")] == 1
    assert b.elector.leader == "replica-a"


async def test_a_crashed_leader_is_replaced_within_the_lease_duration(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    # A leader that stops renewing without releasing: what a killed pod leaves behind.
    a = await replicas("replica-a", release_on_cancel=False)
    await until(lambda: a.leading)
    b = await replicas("replica-b")
    rv = lease(fake_kube)["metadata"]["resourceVersion"]
    await until(lambda: lease(fake_kube)["metadata"]["resourceVersion"] != rv)  # b has seen a renewal
    acquired_by_a = spec(fake_kube)["acquireTime"]

    await a.elector.stop()
    crashed = time.monotonic()
    assert spec(fake_kube)["holderIdentity"] == "replica-a"  # not released

    await until(lambda: b.leading, timeout=5.0)
    waited = b.became_leader_at() - crashed
    # Not before the lease ran out: b saw a's last renewal at most one retry wait before the crash.
    # At most: b notices that renewal up to one retry wait after the crash, waits the lease
    # duration, and tries again within one more retry wait.
    assert 1.0 - MAX_RETRY_WAIT <= waited <= 1.0 + 2 * MAX_RETRY_WAIT + 0.5, waited
    taken = spec(fake_kube)
    assert (taken["holderIdentity"], taken["leaseTransitions"]) == ("replica-b", 1)
    assert acquired_by_a < taken["acquireTime"] <= taken["renewTime"]


async def test_stopping_releases_the_lease(replicas: Callable[..., Any], fake_kube: FakeKube) -> None:
    a = await replicas("replica-a")
    await until(lambda: a.leading)
    acquired = spec(fake_kube)["acquireTime"]

    await a.elector.stop()
    released = spec(fake_kube)
    # client-go `tryRelease`: no holder, a one-second lease, both times now, transitions kept.
    assert released["holderIdentity"] == ""
    assert (released["leaseDurationSeconds"], released["leaseTransitions"]) == (1, 0)
    assert released["acquireTime"] == released["renewTime"] != acquired
    assert MICRO_TIME.fullmatch(released["renewTime"])
    assert a.events[-1][0] is False and not a.leading
    assert leader_status(a.registry) == 0.0


async def test_a_released_lease_is_taken_over_at_once(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    # A 5s lease: without the release the other replica would wait about that long.
    slow_lease = {"lease_duration": 5.0, "renew_deadline": 3.0, "retry_period": 0.2}
    a = await replicas("replica-a", **slow_lease)
    await until(lambda: a.leading)
    b = await replicas("replica-b", **slow_lease)
    gets = fake_kube.counts[("get", "leases")]
    await until(lambda: fake_kube.counts[("get", "leases")] >= gets + 2)  # b is polling

    await a.elector.stop()
    stopped = time.monotonic()
    await until(lambda: b.leading, timeout=5.0)
    assert b.became_leader_at() - stopped <= MAX_RETRY_WAIT + 0.5
    taken = spec(fake_kube)
    assert (taken["holderIdentity"], taken["leaseDurationSeconds"], taken["leaseTransitions"]) == (
        "replica-b",
        5,
        1,
    )


async def test_a_lease_someone_else_renews_is_never_taken(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    def other_holder(renew_time: str) -> dict[str, Any]:
        return {
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 1,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": renew_time,
                "leaseTransitions": 4,
            },
        }

    fake_kube.add_object("leases", other_holder("2026-01-01T00:00:00.000000Z"))
    last_renewal = time.monotonic()

    async def renew_forever() -> None:
        nonlocal last_renewal
        for n in range(1, 10_000):
            fake_kube.update_object("leases", other_holder(f"2026-01-01T00:00:00.{n:06d}Z"))
            last_renewal = time.monotonic()
            await asyncio.sleep(0.1)  # the other holder's renewal cadence, well inside its 1 s lease

    renewer = asyncio.create_task(renew_forever())
    try:
        a = await replicas("replica-a")
        # Many polls spanning several lease durations: never leading, never writing.
        await until(lambda: fake_kube.counts[("get", "leases")] >= 10)
        assert a.events == [] and not a.leading
        assert fake_kube.counts[("update", "leases")] + fake_kube.counts[("create", "leases")] == 0
        assert a.elector.leader == "someone-else"
    finally:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
    stopped_renewing = last_renewal

    await until(lambda: a.leading, timeout=5.0)
    # Validity counts from when the change was observed, which is after the renewal happened.
    waited = a.became_leader_at() - stopped_renewing
    assert 1.0 <= waited <= 1.0 + 2 * MAX_RETRY_WAIT + 0.5, waited
    taken = spec(fake_kube)
    assert (taken["holderIdentity"], taken["leaseTransitions"], taken["leaseDurationSeconds"]) == (
        "replica-a",
        5,
        1,
    )


# --- optimistic concurrency ------------------------------------------------------------------------


async def test_a_stale_write_is_a_conflict_with_upstreams_message(
    client: KubeClient, fake_kube: FakeKube
) -> None:
    first = LeaseLock(client, NAMESPACE, NAME, renew_deadline=0.6)
    second = LeaseLock(client, NAMESPACE, NAME, renew_deadline=0.6)
    assert await first.get() is None
    record = ElectionRecord("x", 1, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.000000Z")
    await first.create(record)
    with pytest.raises(LockError) as exists:
        await second.create(record)  # both saw NotFound; only one create wins
    assert (exists.value.status, exists.value.reason, exists.value.is_conflict) == (
        409,
        "AlreadyExists",
        False,
    )
    assert 'leases.coordination.k8s.io "aggregator" already exists' in str(exists.value)

    # Both read the same version; the first update wins, the second is refused.
    assert await first.get() == await second.get() == record
    await first.update(ElectionRecord("first", 1, record.acquire_time, record.renew_time, 1))
    with pytest.raises(LockError) as conflict:
        await second.update(ElectionRecord("second", 1, record.acquire_time, record.renew_time, 1))
    assert conflict.value.is_conflict and conflict.value.status == 409
    assert (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "aggregator": the object has been '
        "modified; please apply your changes to the latest version and try again"
    ) in str(conflict.value)
    assert spec(fake_kube)["holderIdentity"] == "first"
    # Reading again makes the next write conditional on the latest version.
    assert (await second.get() or ElectionRecord()).holder_identity == "first"
    await second.update(ElectionRecord("second", 1, record.acquire_time, record.renew_time, 2))
    assert spec(fake_kube)["holderIdentity"] == "second"


async def test_the_fake_refuses_what_kube_apiserver_refuses(client: KubeClient, fake_kube: FakeKube) -> None:
    # Guards the fake: a Lease without a resourceVersion, with second-precision times, or with a
    # zero duration is refused, so the tests above would notice an elector that sent one.
    base = {"metadata": {"name": NAME}, "spec": {"holderIdentity": "x", "leaseDurationSeconds": 1}}
    created = await client.request(calls.CREATE_LEASES, namespace=NAMESPACE, json_body=base)
    assert created.status == 201
    unconditional = await client.request(calls.UPDATE_LEASES, namespace=NAMESPACE, name=NAME, json_body=base)
    assert (unconditional.status, unconditional.json()["reason"]) == (422, "Invalid")
    assert unconditional.json()["message"] == (
        'leases.coordination.k8s.io "aggregator" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )
    seconds = {"metadata": {"name": "b"}, "spec": {"renewTime": "2026-01-01T00:00:00Z"}}
    bad_time = await client.request(calls.CREATE_LEASES, namespace=NAMESPACE, json_body=seconds)
    assert (bad_time.status, bad_time.json()["reason"]) == (400, "BadRequest")
    zero = {"metadata": {"name": "c"}, "spec": {"leaseDurationSeconds": 0}}
    invalid = await client.request(calls.CREATE_LEASES, namespace=NAMESPACE, json_body=zero)
    assert invalid.json()["message"] == (
        'Lease.coordination.k8s.io "c" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0'
    )
    missing = await client.request(calls.GET_LEASES, namespace=NAMESPACE, name="nope")
    assert (missing.status, missing.json()["message"]) == (404, 'leases.coordination.k8s.io "nope" not found')


async def test_a_leader_whose_lease_changed_under_it_renews_by_reading_again(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    a = await replicas("replica-a")
    await until(lambda: a.leading)
    # Someone labels the Lease: the leader's next optimistic update is a 409 Conflict.
    edited = lease(fake_kube)
    edited["metadata"]["labels"] = {"team": "platform"}
    fake_kube.update_object("leases", edited)
    edited_rv = int(lease(fake_kube)["metadata"]["resourceVersion"])

    slowpath = {"name": NAME}
    await until(
        lambda: (
            int(lease(fake_kube)["metadata"]["resourceVersion"]) > edited_rv
            and (a.registry.get_sample_value("leader_election_slowpath_total", slowpath) or 0) >= 1
        )
    )
    renewed = lease(fake_kube)
    assert renewed["metadata"]["labels"] == {"team": "platform"}  # written on the fresh object
    assert renewed["spec"]["holderIdentity"] == "replica-a" and renewed["spec"]["leaseTransitions"] == 0
    assert a.leading and [leading for leading, _ in a.events] == [True]


async def test_a_leader_that_cannot_renew_steps_down_and_campaigns_again(
    replicas: Callable[..., Any], fake_kube: FakeKube
) -> None:
    a = await replicas("replica-a")
    await until(lambda: a.leading)
    fake_kube.slow(30, resource="leases")  # kube-apiserver stops answering Lease calls
    slowed = time.monotonic()
    try:
        await until(lambda: not a.leading, timeout=5.0)
        lost = next(at for leading, at in a.events if not leading)
        # The next renewal starts within one retry and gives up at the renew deadline: before
        # the lease runs out for the others (a whole lease duration after the last renewal).
        assert lost - slowed <= 0.2 + 0.6 + 0.3, lost - slowed
        assert leader_status(a.registry) == 0.0
        assert a.elector.notes() == [
            f"info: {CHECK_NAME}: not leading lease {NAMESPACE}/{NAME} (renewal failed; campaigning again)"
        ]
    finally:
        fake_kube.release()
    await until(lambda: a.leading)
    assert [leading for leading, _ in a.events] == [True, False, True]


# --- health and identity ---------------------------------------------------------------------------


async def test_the_health_check_shows_leadership_and_fails_only_a_stuck_leader(
    client: KubeClient, replicas: Callable[..., Any]
) -> None:
    a = await replicas("replica-a")
    await until(lambda: a.leading)
    b = await replicas("replica-b")
    await until(lambda: b.elector.leader == "replica-a")
    assert a.elector.check() is None and b.elector.check() is None
    assert a.elector.notes() == [f"info: {CHECK_NAME}: leading lease {NAMESPACE}/{NAME} as replica-a"]
    assert b.elector.notes() == [
        f"info: {CHECK_NAME}: not leading lease {NAMESPACE}/{NAME} (held by replica-a)"
    ]

    # client-go `Check`: a leader whose last renewal is lease duration + 20s old is stuck.
    skew = [0.0]
    stuck = LeaderElector(
        client,
        LeaderElectionMetrics(CollectorRegistry()),
        namespace=NAMESPACE,
        name="stuck",
        identity="s",
        clock=lambda: time.monotonic() + skew[0],
        **FAST,
    )
    await stuck.start()
    try:
        await until(lambda: stuck.is_leader)
        skew[0] = 1.0 + 20.0 + 5.0
        assert stuck.check() == "failed election to renew leadership on lease stuck"
    finally:
        await stuck.stop()
    assert stuck.check() is None  # stopped: no longer leading


def test_identity_is_hostname_and_a_random_uuid() -> None:
    first, second = default_identity(), default_identity()
    assert re.fullmatch(re.escape(socket.gethostname()) + r"_[0-9a-f-]{36}", first)
    assert first != second


def test_the_lease_namespace_is_the_flag_else_the_pods_namespace(tmp_path: Path) -> None:
    file = tmp_path / "namespace"
    assert lease_namespace("explicit", environ={"POD_NAMESPACE": "p"}, namespace_file=file) == "explicit"
    assert lease_namespace("", environ={"POD_NAMESPACE": "p"}, namespace_file=file) == "p"
    assert lease_namespace("", environ={}, namespace_file=file) == "default"
    file.write_text("aggregator-system\n")
    assert lease_namespace("", environ={}, namespace_file=file) == "aggregator-system"


# --- flags -------------------------------------------------------------------------------------------


@pytest.fixture
def objects_dir(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "objs").mkdir()
    yield str(tmp_path / "objs")


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ([], None),  # local mode keeps working with the defaults
        (
            [
                "--leader-elect-lease-duration=1s",
                "--leader-elect-renew-deadline=600ms",
                "--leader-elect-retry-period=200ms",
            ],
            None,
        ),
        (  # kube mode only: given in local mode, refused before anything else
            ["--leader-elect=false", "--leader-elect-lease-duration=1s"],
            "--leader-elect: only applies in kube mode; it means nothing with --apiservices-dir",
        ),
        (
            ["--leader-elect-lease-duration=10s"],
            "--leader-elect-lease-duration: leaseDuration must be greater than renewDeadline",
        ),
        (
            ["--leader-elect-renew-deadline=2.4s"],  # == 2s * 1.2: not greater
            "--leader-elect-renew-deadline: renewDeadline must be greater than retryPeriod*JitterFactor",
        ),
        (["--leader-elect-renew-deadline=2.5s"], None),
        (["--leader-elect-retry-period=0s"], "--leader-elect-retry-period: must be greater than zero"),
        (
            ["--leader-elect-resource-lock=endpoints"],
            "--leader-elect-resource-lock: endpoints lock is removed, migrate to leases",
        ),
        (
            ["--leader-elect-resource-lock=configmapsleases"],
            "--leader-elect-resource-lock: configmapsleases lock is removed, migrated to leases",
        ),
        (
            ["--leader-elect-resource-lock=locks"],
            "--leader-elect-resource-lock: Invalid lock-type locks; possible values: leases",
        ),
        (["--leader-elect-resource-name="], "--leader-elect-resource-name: Required value"),
    ],
)
def test_the_flags_are_validated_as_upstream_validates_them(
    objects_dir: str, flags: list[str], error: str | None
) -> None:
    args = build_parser().parse_args(["serve", "--apiservices-dir", objects_dir, *flags])
    options = options_from_args(args)
    if error is None:
        validate(options)
        return
    with pytest.raises(ConfigError) as raised:
        validate(options)
    assert str(raised.value) == error


def test_the_defaults_are_kube_controller_managers(objects_dir: str) -> None:
    options = options_from_args(build_parser().parse_args(["serve", "--apiservices-dir", objects_dir]))
    assert (
        options.leader_election.leader_elect,
        options.leader_election.lease_duration,
        options.leader_election.renew_deadline,
        options.leader_election.retry_period,
        options.leader_election.resource_lock,
        options.leader_election.resource_name,
        options.leader_election.resource_namespace,
    ) == (True, 15.0, 10.0, 2.0, "leases", "aggregator", "")


def test_the_elector_refuses_what_client_go_refuses() -> None:
    client_free_api: Any = None  # refused before any call could be made
    registry = CollectorRegistry()
    metrics = LeaderElectionMetrics(registry)
    with pytest.raises(ValueError, match=r"^leaseDuration must be greater than renewDeadline$"):
        LeaderElector(client_free_api, metrics, namespace="ns", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match=r"^renewDeadline must be greater than retryPeriod\*JitterFactor$"):
        LeaderElector(client_free_api, metrics, namespace="ns", renew_deadline=2.4, retry_period=2)
    with pytest.raises(ValueError, match=r"^Lock identity is empty$"):
        LeaderElector(client_free_api, metrics, namespace="ns", identity="")
    assert leader_status(registry) is None  # nothing registered a series for a refused elector
    LeaderElector(client_free_api, metrics, namespace="ns", identity="x")
    assert leader_status(registry) == 0.0  # upstream sets leaderOff at construction


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"holderIdentity": 5}, "lease spec.holderIdentity: expected string, got int"),
        ({"leaseDurationSeconds": "15"}, "lease spec.leaseDurationSeconds: expected integer, got str '15'"),
        ({"leaseTransitions": True}, "lease spec.leaseTransitions: expected integer, got bool True"),
        ([], "lease spec is not an object"),
    ],
)
def test_a_lease_spec_field_of_the_wrong_type_is_named(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ElectionRecord.from_lease_spec(spec)


def test_a_lease_spec_reads_absent_fields_as_empty() -> None:
    record = ElectionRecord.from_lease_spec({"holderIdentity": "a", "leaseDurationSeconds": 15})
    assert record == ElectionRecord("a", 15)
