"""Kube mode: `--write-apiservice-status` PUTs the status subresource once per change, never per check,
from the one replica holding the Lease, and never just to change the message."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from aggregator.assembly import build_gateway
from aggregator.availability.checker import AvailabilityChecker
from aggregator.availability.conditions import failed_discovery_check, passed, service_not_found
from aggregator.availability.status import ALWAYS_LEADS, KubeStatusWriter
from aggregator.config import complete
from aggregator.kube.client import KubeClient
from aggregator.leaderelection import LeaderElector
from aggregator.model.apiservice import APIService, ServiceReference, decode_apiservice
from aggregator.runners.server import GatewayServer
from aggregator.sources.store import Store
from tests.availability.conftest import StartBackend
from tests.support.backend import (
    APISERVICE,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.fakekube import FakeKube, kube_options
from tests.support.pki import PKI
from tests.support.polling import until

WRITES = ("update", "apiservices/status")


def register(fake: FakeKube, backend: FakeBackend, backend_pki: BackendPKI) -> None:
    svc = apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem)
    del svc["status"]
    fake.add_object("apiservices", svc)
    fake.add_object("services", service_manifest(port=backend.port))
    fake.add_object(
        "endpointslices", endpointslice_manifest("api-1", [("127.0.0.1", True)], port=backend.port)
    )


def condition(fake: FakeKube) -> dict[str, Any] | None:
    obj = fake.get_object("apiservices", APISERVICE) or {}
    conditions = obj.get("status", {}).get("conditions", [])
    return conditions[0] if conditions else None


@pytest.fixture
async def kube_gateway(pki: PKI, fake_kube: FakeKube) -> AsyncIterator[Callable[..., Any]]:
    async with AsyncExitStack() as stack:

        async def start(**options: Any) -> AvailabilityChecker:
            assert fake_kube.kubeconfig is not None
            opts = kube_options(pki, fake_kube.kubeconfig, **options)
            config = complete(opts)
            gateway = build_gateway(config)
            checker = gateway.control.availability
            assert isinstance(checker, AvailabilityChecker)
            checker.interval, checker.retry_initial = 0.05, 0.05
            checker.probe.timeout = 1.0
            server = GatewayServer(config, gateway)
            await server.start()
            stack.push_async_callback(server.stop)
            return checker

        yield start


async def test_status_is_written_once_per_change(
    kube_gateway: Callable[..., Any],
    fake_kube: FakeKube,
    start_backend: StartBackend,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_backend()
    register(fake_kube, backend, backend_pki)
    checker: AvailabilityChecker = await kube_gateway(write_apiservice_status=True)

    await until(lambda: (condition(fake_kube) or {}).get("status") == "True")
    up = condition(fake_kube)
    assert up is not None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", up.pop("lastTransitionTime"))
    assert up == {"type": "Available", "status": "True", "reason": "Passed", "message": "all checks passed"}
    checks = checker.checks
    await until(lambda: checker.checks >= checks + 10)  # many re-checks, every 50 ms
    assert fake_kube.counts[WRITES] == 1

    await backend.stop()
    await until(lambda: (condition(fake_kube) or {}).get("status") == "False")
    down = condition(fake_kube)
    assert down is not None and down["reason"] == "FailedDiscoveryCheck"
    assert down["message"].startswith(
        f"failing or missing response from https://127.0.0.1:{backend.port}/apis/"
    )
    assert "[hop: connect; " in down["message"]
    checks = checker.checks
    await until(lambda: checker.checks >= checks + 10)
    assert fake_kube.counts[WRITES] == 2
    writer = next(r for r in fake_kube.requests if (r.verb, r.resource) == WRITES)
    assert writer.path == f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}/status"


async def test_without_the_flag_nothing_is_written_and_the_proxy_still_follows(
    kube_gateway: Callable[..., Any],
    fake_kube: FakeKube,
    start_backend: StartBackend,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_backend()
    register(fake_kube, backend, backend_pki)
    checker: AvailabilityChecker = await kube_gateway()
    await until(lambda: checker.is_available(APISERVICE))
    await backend.stop()
    await until(lambda: not checker.is_available(APISERVICE))
    verdict = checker.verdict(APISERVICE)
    assert verdict is not None and verdict.reason == "FailedDiscoveryCheck"
    assert fake_kube.counts[WRITES] == 0
    assert condition(fake_kube) is None


async def test_a_conflict_reads_the_object_again(fake_kube: FakeKube) -> None:
    manifest = apiservice_manifest(port=443, ca_pem=None)
    del manifest["status"]
    stale = decode_apiservice(fake_kube.add_object("apiservices", manifest))
    # Someone else (kube-apiserver's own aggregator) writes the status meanwhile.
    current = fake_kube.get_object("apiservices", APISERVICE)
    assert current is not None
    current["status"] = {
        "conditions": [{"type": "Available", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    }
    fake_kube.update_object("apiservices", current)

    assert fake_kube.kubeconfig is not None
    client = KubeClient.from_kubeconfig(str(fake_kube.kubeconfig))
    await client.start()
    try:
        writer = KubeStatusWriter(client, Store(), ALWAYS_LEADS)
        # 409 on the stale object, a re-read, and the condition applied to what the other writer
        # left: same status, so its transition time stays; reason and message are ours.
        assert await writer.apply(stale, passed()) is not None
        assert (fake_kube.counts[WRITES], fake_kube.counts[("get", "apiservices")]) == (2, 1)
        assert condition(fake_kube) == {
            "type": "Available",
            "status": "True",
            "lastTransitionTime": "2020-01-01T00:00:00Z",
            "reason": "Passed",
            "message": "all checks passed",
        }
        # A flip after a conflict: written on the fresh object, the transition time stamped now.
        assert await writer.apply(stale, service_not_found(ServiceReference("demo", "api"))) is not None
        assert (fake_kube.counts[WRITES], fake_kube.counts[("get", "apiservices")]) == (4, 2)
        written = condition(fake_kube)
        assert written is not None and written["reason"] == "ServiceNotFound"
        assert written["lastTransitionTime"] != "2020-01-01T00:00:00Z"
        # The same verdict again: after the conflict and re-read there is nothing left to write.
        assert await writer.apply(stale, service_not_found(ServiceReference("demo", "api"))) is None
        assert (fake_kube.counts[WRITES], fake_kube.counts[("get", "apiservices")]) == (5, 3)
    finally:
        await client.stop()


# --- two writers: the gateway's replicas, and kube-apiserver's own aggregator ------------------------

FAST_ELECTION = {
    "leader_elect_lease_duration": 1.0,
    "leader_elect_renew_deadline": 0.6,
    "leader_elect_retry_period": 0.2,
}


@dataclass
class Leads:
    """A `Leadership` a test sets by hand."""

    is_leader: bool


@pytest.fixture
async def kube_client(fake_kube: FakeKube) -> AsyncIterator[KubeClient]:
    assert fake_kube.kubeconfig is not None
    client = KubeClient.from_kubeconfig(str(fake_kube.kubeconfig))
    await client.start()
    yield client
    await client.stop()


def stored(fake: FakeKube, condition: dict[str, Any]) -> APIService:
    """The APIService in kube-apiserver with `condition` as its status, as another writer left it."""
    manifest = apiservice_manifest(port=443, ca_pem=None)
    manifest["status"] = {"conditions": [condition]}
    return decode_apiservice(fake.add_object("apiservices", manifest))


async def test_of_two_writers_only_the_leader_writes(kube_client: KubeClient, fake_kube: FakeKube) -> None:
    svc = stored(fake_kube, {"type": "Available", "status": "True", "reason": "Passed"})
    leader, follower = Leads(True), Leads(False)
    writers = [KubeStatusWriter(kube_client, Store(), lead) for lead in (follower, leader)]
    down = service_not_found(ServiceReference("demo", "api"))

    results = [await writer.apply(svc, down) for writer in writers]
    assert results[0] is None and results[1] is not None
    assert fake_kube.counts[WRITES] == 1
    written = condition(fake_kube)
    assert written is not None and (written["status"], written["reason"]) == ("False", "ServiceNotFound")

    # Leadership moves; the new leader finds the verdict already stored and writes nothing.
    leader.is_leader, follower.is_leader = False, True
    fresh = decode_apiservice(fake_kube.get_object("apiservices", APISERVICE) or {})
    assert [await writer.apply(fresh, down) for writer in writers] == [None, None]
    assert fake_kube.counts[WRITES] == 1


async def test_a_different_message_alone_is_never_written(
    kube_client: KubeClient, fake_kube: FakeKube
) -> None:
    # kube-apiserver's aggregator wrote its own wording for the verdict the gateway agrees with.
    theirs = {
        "type": "Available",
        "status": "False",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
        "reason": "FailedDiscoveryCheck",
        "message": "failing or missing response from https://10.0.0.1:443/apis/demo.example.com/v1: "
        "Get ...: dial tcp 10.0.0.1:443: connect: connection refused",
    }
    svc = stored(fake_kube, theirs)
    writer = KubeStatusWriter(kube_client, Store(), ALWAYS_LEADS)
    ours = failed_discovery_check(
        "failing or missing response from https://10.0.0.1:443/apis/...", ["hop: connect"]
    )
    assert ours.message != theirs["message"]
    assert await writer.apply(svc, ours) is None
    assert fake_kube.counts[WRITES] == 0 and condition(fake_kube) == theirs

    # Another reason with the same status is written: the transition time stays, the words are ours.
    gone = service_not_found(ServiceReference("demo", "api"))
    assert await writer.apply(svc, gone) is not None
    assert condition(fake_kube) == {
        "type": "Available",
        "status": "False",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
        "reason": "ServiceNotFound",
        "message": gone.message,
    }
    assert fake_kube.counts[WRITES] == 1


async def test_replicas_elect_one_status_writer_and_the_next_one_takes_over(
    pki: PKI,
    fake_kube: FakeKube,
    start_backend: StartBackend,
    backend_pki: BackendPKI,
) -> None:
    backend = await start_backend()
    register(fake_kube, backend, backend_pki)
    assert fake_kube.kubeconfig is not None
    async with AsyncExitStack() as stack:
        replicas: list[tuple[GatewayServer, AvailabilityChecker, LeaderElector]] = []
        for _ in range(2):
            opts = kube_options(pki, fake_kube.kubeconfig, write_apiservice_status=True, **FAST_ELECTION)
            config = complete(opts)
            gateway = build_gateway(config)
            checker = gateway.control.availability
            assert isinstance(checker, AvailabilityChecker)
            checker.interval, checker.retry_initial = 0.05, 0.05
            checker.probe.timeout = 1.0
            elector = gateway.control.elector
            assert elector is not None
            server = GatewayServer(config, gateway)
            await server.start()
            stack.push_async_callback(server.stop)
            replicas.append((server, checker, elector))

        await until(lambda: (condition(fake_kube) or {}).get("status") == "True")
        await until(lambda: all(checker.checks >= 10 for _, checker, _ in replicas))
        leading = [elector.is_leader for _, _, elector in replicas]
        assert sorted(leading) == [False, True]
        assert fake_kube.counts[WRITES] == 1  # both checked many times; only the leader wrote

        # Who leads shows in /readyz?verbose (ready either way) and in the leader metric.
        for server, _, elector in replicas:
            status, body = await get(server, pki, "/readyz?verbose")
            assert status == 200 and "[+]leaderElection ok\n" in body
            word = "leading" if elector.is_leader else "not leading"
            assert f"info: leaderElection: {word} lease default/aggregator" in body
            metrics = server.gateway.metrics.registry
            value = metrics.get_sample_value("leader_election_master_status", {"name": "aggregator"})
            assert value == (1.0 if elector.is_leader else 0.0)

        # The leader goes away (releasing the lease); the other replica writes the next change.
        first = leading.index(True)
        await replicas[first][0].stop()
        other = replicas[1 - first][2]
        await until(lambda: other.is_leader, timeout=5.0)
        await backend.stop()
        await until(lambda: (condition(fake_kube) or {}).get("status") == "False")
        assert fake_kube.counts[WRITES] == 2


async def test_a_replica_that_starts_leading_writes_what_it_found_at_once(
    pki: PKI,
    fake_kube: FakeKube,
    start_backend: StartBackend,
    backend_pki: BackendPKI,
) -> None:
    """Another replica holds the Lease while this one finds the backend available (and writes
    nothing); once the Lease is released this one takes it and writes its verdict at once, not at
    its next periodic check."""
    backend = await start_backend()
    register(fake_kube, backend, backend_pki)
    fake_kube.add_object(
        "leases",
        {
            "metadata": {"name": "aggregator", "namespace": "default"},
            "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                     "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z",
                     "leaseTransitions": 0},
        },
    )  # fmt: skip
    assert fake_kube.kubeconfig is not None
    opts = kube_options(pki, fake_kube.kubeconfig, write_apiservice_status=True, **FAST_ELECTION)
    config = complete(opts)
    gateway = build_gateway(config)
    checker, elector = gateway.control.availability, gateway.control.elector
    assert isinstance(checker, AvailabilityChecker) and elector is not None
    checker.interval = 3600.0  # no periodic check within the test
    server = GatewayServer(config, gateway)
    await server.start()
    try:
        await until(lambda: checker.verdict(APISERVICE) is not None, what="the first verdict")
        assert checker.is_available(APISERVICE) and not elector.is_leader
        assert fake_kube.counts[WRITES] == 0 and condition(fake_kube) is None
        checks = checker.checks
        lease = fake_kube.get_object("leases", "aggregator", "default")
        assert lease is not None
        lease["spec"] = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}  # released
        fake_kube.add_object("leases", lease)
        await until(lambda: (condition(fake_kube) or {}).get("status") == "True", what="the verdict written")
        assert elector.is_leader and fake_kube.counts[WRITES] == 1
        assert checker.checks == checks + 1  # one check of the APIService, on taking the Lease
    finally:
        await server.stop()


async def get(server: GatewayServer, pki: PKI, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + path, ssl=pki.client_context()) as resp,
    ):
        return resp.status, await resp.text()
