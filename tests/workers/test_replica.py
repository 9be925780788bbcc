"""What the control process derives from kube-apiserver reaches a worker before it serves, and
every change after: a real control gateway (kube mode against the fake kube-apiserver, no CA
flags), its `Publisher`, and a worker's `Replica` and request path built the way a worker process
builds them (the gateway after the first snapshot), over a real socketpair channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web

from aggregator.assembly import Gateway, build_gateway
from aggregator.auth.authconfigmap import CHECK_NAME as CLUSTER_AUTH_CHECK
from aggregator.config import complete
from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.tls.issue import new_ca
from aggregator.workers.channel import Channel
from aggregator.workers.messages import Hello, State
from aggregator.workers.publisher import Publisher, families
from aggregator.workers.replica import Replica
from tests.support.fakekube import (
    CLUSTER_CAS,
    Attributes,
    FakeKube,
    apiservice,
    endpointslice,
    kube_options,
    service,
    status_response,
)
from tests.support.fakereviews import FakeReviews
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port

DEAD = "v1.dead.example.com"


@dataclass
class Pair:
    control: Gateway
    publisher: Publisher
    replica: Replica
    worker: Gateway


def readyz(gateway: Gateway, name: str) -> str | None:
    (check,) = [c for c in gateway.health.checks_for("readyz") if c.name == name]
    return check.check()


@pytest.fixture
async def pair(fake_kube: FakeKube, pki: PKI) -> AsyncIterator[Pair]:
    async with started_pair(fake_kube, pki, settled=True) as started:
        yield started


@contextlib.asynccontextmanager
async def started_pair(fake_kube: FakeKube, pki: PKI, *, settled: bool = False) -> AsyncIterator[Pair]:
    """`settled`: the worker connects once the control has its first verdict (so the snapshot
    holds one); otherwise at once, as a worker started with the control does."""
    FakeReviews(fake_kube)
    dead_port = free_port()  # a port nothing listens on: the backend refuses connections
    registration = apiservice("dead.example.com", "v1", service=("dead", "api"))
    registration["spec"]["service"]["port"] = dead_port
    fake_kube.add_object("apiservices", registration)
    fake_kube.add_object("services", service("dead", "api", cluster_ip="127.0.0.1", port=dead_port))
    fake_kube.add_object("endpointslices", endpointslice("dead", "api-1", addresses=("127.0.0.1",)))
    assert fake_kube.kubeconfig is not None
    options = kube_options(pki, fake_kube.kubeconfig, **CLUSTER_CAS, workers=2)
    config = complete(options)
    control = build_gateway(config)
    await control.start()
    publisher = Publisher(
        store=control.store,
        availability=control.control.availability,
        health=control.health,
        discovery=control.control.discovery,
        openapi=control.control.openapi,
        cluster_auth=control.control.cluster_auth,
        collectors=lambda: families([control.metrics.registry]),
    )
    ours, theirs = socket.socketpair()
    tasks: list[asyncio.Task[None]] = []
    try:
        if settled:
            await until(
                lambda: control.control.availability.verdict(DEAD) is not None, what="the first verdict"
            )
        await publisher.start()
        to_worker, from_control = await Channel.open(ours), await Channel.open(theirs)
        tasks.append(asyncio.create_task(publisher.serve(0, to_worker)))
        # As `runners/worker.py` does: the snapshot first, then the request path, then the updates.
        metrics = GatewayMetrics.declare()
        replica = Replica(
            from_control,
            Hello(0, 2, control.hop, publisher.checks()),
            collect=lambda: list(metrics.registry.collect()),
        )
        replica.apply(await from_control.receive())
        worker = build_gateway(config, replica=replica, metrics=metrics)
        tasks.append(asyncio.create_task(replica.run()))
        yield Pair(control, publisher, replica, worker)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await publisher.stop()
        await control.stop()
        theirs.close()


# Every field of `State`, and how a worker shows it: a field added without a line here fails.
COVERED = {
    "snapshot",
    "objects",
    "revision",
    "synced",
    "verdicts",
    "health",
    "notes",
    "discovery",
    "openapi_v2",
    "openapi_v3_index",
    "openapi_v3",
    "cluster_auth",
    # local mode only (this pair runs kube mode): the folder's RBAC reaches a worker in
    # tests/auth/test_local_rbac.py::test_a_worker_started_after_a_bad_edit_keeps_the_last_good_rules
    "rbac",
    # the discovery quarantine: a worker's legacy `/apis` drops the group in
    # tests/e2e/test_quarantine.py (kube mode --workers 2 and 1, local mode --workers unset and 1)
    "quarantined",
}


async def test_the_snapshot_reaches_the_request_path_built_after_it(pair: Pair) -> None:
    assert {f.name for f in dataclasses.fields(State)} == COVERED
    control, replica, worker = pair.control, pair.replica, pair.worker
    # the cluster's authentication settings: the CAs, header names and allowed names
    client_ca, front_proxy = worker.authenticator.client_ca(), worker.authenticator.requestheader()
    assert client_ca is not None and front_proxy is not None
    control_ca, control_front_proxy = control.authenticator.client_ca(), control.authenticator.requestheader()
    assert control_ca is not None and control_front_proxy is not None
    assert client_ca.pem == control_ca.pem and front_proxy.pool.pem == control_front_proxy.pool.pem
    # every other setting equal too: the pools are equal by PEM, compared above
    assert dataclasses.replace(front_proxy, pool=control_front_proxy.pool) == control_front_proxy
    assert front_proxy.allowed_names == {"front-proxy-client"}
    assert front_proxy.group_headers == ("X-Remote-Group",)
    assert readyz(worker, CLUSTER_AUTH_CHECK) is None
    # the objects, at the control's revision, synced
    assert replica.store.revision == control.store.revision and replica.store.synced
    assert replica.store.apiservice(DEAD) == control.store.apiservice(DEAD)
    # verdicts
    assert (replica.is_available(DEAD), replica.reason(DEAD)) == (False, "FailedDiscoveryCheck")
    # the control's checks and notes, mirrored by name (as last published: the control moves on)
    published = pair.publisher._published
    await until(
        lambda: all(replica.check(c.name)() == published.health[c.name] for c in replica.hello.checks),
        what="the control's checks",
    )
    assert any(DEAD in line for line in replica.notes("readyz")())
    # discovery and OpenAPI, as rendered by the control
    assert worker.router is not None and not control.control.discovery.legacy_only
    assert replica.v2.json.body == control.control.openapi.v2.json.body
    assert replica.v3.index.body == control.control.openapi.v3.index.body
    assert replica.v3.documents.keys() == control.control.openapi.v3.documents.keys()


async def test_a_changed_client_ca_reaches_the_worker(pair: Pair, fake_kube: FakeKube) -> None:
    later = new_ca("later-client-ca")
    fake_kube.publish_authentication(client_ca=fake_kube.client_ca.cert_pem + later.cert_pem)

    def has_later() -> bool:
        pool = pair.worker.authenticator.client_ca()
        return pool is not None and later.cert_pem in pool.pem

    await until(has_later, what="the new client CA in the worker")


async def test_a_worker_is_ready_only_once_it_holds_the_clusters_authentication(
    fake_kube: FakeKube, pki: PKI
) -> None:
    """The gateway may not read the ConfigMap yet (RBAC not granted): the control starts anyway, and
    neither it nor its worker is ready until the settings arrive; then both are, without a restart."""

    def forbid_configmaps(_request: web.Request, attributes: Attributes) -> web.StreamResponse | None:
        if attributes.resource is not None and attributes.resource.resource == "configmaps":
            return status_response(403, "Forbidden", "configmaps is forbidden")
        return None

    fake_kube.enforce(forbid_configmaps)
    async with started_pair(fake_kube, pki) as pair:
        assert pair.worker.authenticator.client_ca() is None
        assert readyz(pair.worker, CLUSTER_AUTH_CHECK) is not None
        assert readyz(pair.control, CLUSTER_AUTH_CHECK) is not None
        fake_kube.enforce(None)
        await until(lambda: readyz(pair.worker, CLUSTER_AUTH_CHECK) is None, what="the worker ready")
        assert pair.worker.authenticator.client_ca() is not None
        assert readyz(pair.control, CLUSTER_AUTH_CHECK) is None


async def test_an_interval_of_the_publisher_reads_no_apiservice(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing on the publisher's timer walks the APIServices or their verdicts: at 5000 APIServices
    a walk every 100 ms cost two thirds of the control's CPU. Verdicts and notes reach the
    workers as they change (the tests above and tests/runners/test_supervisor.py)."""
    reads: Counter[str] = Counter()

    def counting(name: str, method: Callable[..., object]) -> Callable[..., object]:
        def counted(*args: object, **kwargs: object) -> object:
            reads[name] += 1
            return method(*args, **kwargs)

        return counted

    store, availability = pair.control.store, pair.control.control.availability
    for name in ("apiservices", "objects"):
        monkeypatch.setattr(store, name, counting(f"store.{name}", getattr(store, name)))
    monkeypatch.setattr(availability, "verdict", counting("availability.verdict", availability.verdict))
    publisher = pair.publisher
    ticks = publisher.ticks
    await until(lambda: publisher.ticks >= ticks + 5, what="five intervals of the publisher")
    assert reads == {}
