"""API Priority and Fairness as a user meets it through a running gateway (local mode, the folder's
FlowSchemas and priority levels), over HTTP/1.1 and HTTP/2: the headers that name the FlowSchema and
priority level, dispatching, queuing and refusing, seats given back, the metrics."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from aggregator.flowcontrol import bootstrap
from aggregator.flowcontrol.objects import FLOW_SCHEMA, PRIORITY_LEVEL
from tests.flowcontrol.client import FS_UID, PL_UID, PROTOCOLS, client
from tests.flowcontrol.support import flow_schema, priority_level
from tests.support.backend import (
    PREFIX,
    apiservice_manifest,
    backend_service,
    wait_available,
    write_manifests,
)
from tests.support.fixtures import Proxied, StartProxied
from tests.support.holding import Held, Watch
from tests.support.pki import PKI
from tests.support.polling import until, until_async
from tests.support.rbac import cluster_role, cluster_role_binding, rule, user

THINGS = f"{PREFIX}/namespaces/default/things"
TOO_MANY = b"Too many requests, please try again later.\n"
# Every answer the gateway itself gives names these (tenants' objects carry UIDs in their manifests).
TENANTS_FS, TENANTS_PL = "fs-tenants-uid", "pl-tenants-uid"


def uid_of(kind: str, name: str) -> str:
    """The UID the gateway gives a bootstrap object it holds without one (local mode)."""
    objects = (*bootstrap.MANDATORY_LEVELS, *bootstrap.SUGGESTED_LEVELS) if kind == PRIORITY_LEVEL else (
        *bootstrap.MANDATORY_SCHEMAS,
        *bootstrap.SUGGESTED_SCHEMAS,
    )
    return bootstrap.with_uid(next(o for o in objects if o.name == name), kind).uid


def tenants(apiservices_dir: Path, *, queues: int | None = 16, **level: Any) -> None:
    """alice's requests go to the `tenants` level: one seat, never borrowed or lent."""
    write_manifests(
        apiservices_dir,
        "apf",
        priority_level("tenants", shares=10, lendable=0, borrowing=0, queues=queues, uid=TENANTS_PL, **level),
        flow_schema("tenants", "tenants", users=("alice",), uid=TENANTS_FS),
    )


@pytest.fixture
def alice(pki: PKI) -> str:
    return pki.issue_user("alice", "alice", ("devs",))


@pytest.fixture
def bob(pki: PKI) -> str:
    return pki.issue_user("bob", "bob")


async def one_seat(start_proxied: StartProxied, apiservices_dir: Path, **options: Any) -> tuple[Proxied, Held]:
    """The gateway with one seat in all (`tenants` has it), its backend holding requests to THINGS."""
    tenants(apiservices_dir, queues=options.pop("queues", 16))
    proxied = await start_proxied(max_requests_inflight=1, max_mutating_requests_inflight=0, **options)
    held = Held()
    proxied.backend.routes[THINGS] = held
    return proxied, held


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_every_answer_names_the_flow_schema_and_priority_level_that_classified_it(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str, bob: str, protocol: str
) -> None:
    tenants(apiservices_dir)
    write_manifests(
        apiservices_dir,
        "rbac",
        cluster_role("reader", rule(["get", "list", "watch"], ["*"], ["*"])),
        cluster_role_binding("readers", "reader", user("alice"), user("bob")),
    )
    proxied = await start_proxied()
    port = proxied.server.port
    async with client(pki, port, protocol, alice) as as_alice, client(pki, port, protocol, bob) as as_bob:
        answer = await as_alice.request("GET", THINGS)
        assert answer.status == 200 and answer.uids == (TENANTS_FS, TENANTS_PL)
        assert (answer.all(FS_UID), answer.all(PL_UID)) == ([TENANTS_FS], [TENANTS_PL])  # one value each
        answer = await as_bob.request("GET", THINGS)
        assert answer.uids == (uid_of(FLOW_SCHEMA, "global-default"), uid_of(PRIORITY_LEVEL, "global-default"))
        # APF runs before authorization: a refused request was classified too
        answer = await as_bob.request("DELETE", THINGS + "/a")
        assert answer.status == 403 and answer.uids[1] == uid_of(PRIORITY_LEVEL, "global-default")
        # and on the gateway's own answers
        answer = await as_bob.request("GET", "/version")
        assert answer.uids == (uid_of(FLOW_SCHEMA, "global-default"), uid_of(PRIORITY_LEVEL, "global-default"))
    async with client(pki, port, protocol, "admin") as admin:  # system:masters
        answer = await admin.request("GET", THINGS)
        assert answer.uids == (uid_of(FLOW_SCHEMA, "exempt"), uid_of(PRIORITY_LEVEL, "exempt"))
    async with client(pki, port, protocol, None) as anonymous:  # anonymous probes: exempt too
        answer = await anonymous.request("GET", "/readyz")
        assert answer.uids == (uid_of(FLOW_SCHEMA, "probes"), uid_of(PRIORITY_LEVEL, "exempt"))


async def test_one_user_name_in_other_groups_is_classified_by_its_groups_each_time(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI
) -> None:
    """The request path remembers a user's decision by name and checks the groups: carol as a
    member of system:masters is exempt, the same name without the group is not, in any order."""
    admin_carol = pki.issue_user("carol-admin", "carol", ("system:masters",))
    plain_carol = pki.issue_user("carol-plain", "carol")
    proxied = await start_proxied()
    port = proxied.server.port
    exempt = (uid_of(FLOW_SCHEMA, "exempt"), uid_of(PRIORITY_LEVEL, "exempt"))
    plain = (uid_of(FLOW_SCHEMA, "global-default"), uid_of(PRIORITY_LEVEL, "global-default"))
    async with client(pki, port, PROTOCOLS[0], admin_carol) as as_admin, client(
        pki, port, PROTOCOLS[0], plain_carol
    ) as as_plain:
        seen = [(await c.request("GET", THINGS)).uids for c in (as_admin, as_plain, as_plain, as_admin, as_plain)]
    assert seen == [exempt, plain, plain, exempt, plain]


async def test_a_backends_own_apf_headers_follow_the_gateways(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str
) -> None:
    """An extension server running APF answers with its own UIDs; kube-aggregator's proxy adds them
    after its own, so the first value is the aggregator's."""
    async def with_own(_request: web.Request) -> web.Response:
        return web.json_response({}, headers={"X-Kubernetes-PF-FlowSchema-UID": "backend-fs"})

    tenants(apiservices_dir)
    proxied = await start_proxied()
    proxied.backend.routes[THINGS] = with_own
    async with client(pki, proxied.server.port, PROTOCOLS[0], alice) as as_alice:
        answer = await as_alice.request("GET", THINGS)
    assert answer.all(FS_UID) == [TENANTS_FS, "backend-fs"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_reject_level_at_its_limit_answers_429_at_once_with_retry_after_and_the_headers(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str, protocol: str
) -> None:
    proxied, held = await one_seat(start_proxied, apiservices_dir, queues=None)
    async with client(pki, proxied.server.port, protocol, alice) as as_alice:
        first = asyncio.create_task(as_alice.request("GET", THINGS))
        await until(lambda: held.arrived == 1, what="the first GET at the backend")
        refused = await as_alice.request("GET", THINGS)  # answered while the first is held
        assert (refused.status, refused.body) == (429, TOO_MANY)
        assert refused.one("retry-after") == "1" and refused.one("content-type") == "text/plain; charset=utf-8"
        assert refused.uids == (TENANTS_FS, TENANTS_PL)
        held.release.set()
        assert (await first).status == 200
    sample = proxied.server.gateway.metrics.registry.get_sample_value
    labels = {"priority_level": "tenants", "flow_schema": "tenants"}
    assert sample("apiserver_flowcontrol_rejected_requests_total", {**labels, "reason": "concurrency-limit"}) == 1
    assert sample("apiserver_flowcontrol_dispatched_requests_total", labels) == 1
    assert sample("apiserver_flowcontrol_current_executing_seats", labels) == 0
    request_labels = {"verb": "LIST", "dry_run": "", "group": "demo.example.com", "version": "v1"}
    code = {**request_labels, "resource": "things", "subresource": "", "scope": "namespace", "component": "apiserver"}
    assert sample("apiserver_request_total", {**code, "code": "429"}) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_queued_request_runs_when_a_seat_frees_and_one_that_waits_too_long_gets_429(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str, protocol: str
) -> None:
    # --request-timeout 2s: a request waits at most a quarter of it, 0.5 s
    proxied, held = await one_seat(start_proxied, apiservices_dir, request_timeout=2.0)
    registry = proxied.server.gateway.metrics.registry
    labels = {"priority_level": "tenants", "flow_schema": "tenants"}
    async with client(pki, proxied.server.port, protocol, alice) as as_alice:
        first = asyncio.create_task(as_alice.request("GET", THINGS))
        await until(lambda: held.arrived == 1, what="the first GET at the backend")
        queued = asyncio.create_task(as_alice.request("GET", THINGS))
        await until(
            lambda: registry.get_sample_value("apiserver_flowcontrol_current_inqueue_requests", labels) == 1,
            what="the second GET in its queue",
        )
        held.release.set()
        assert [(await first).status, (await queued).status] == [200, 200]
        assert held.arrived == 2
        held.release.clear()
        third = asyncio.create_task(as_alice.request("GET", THINGS))
        await until(lambda: held.arrived == 3, what="the third GET at the backend")
        timed_out = await as_alice.request("GET", THINGS)  # queued, then out after 0.5 s
        assert (timed_out.status, timed_out.body) == (429, TOO_MANY)
        held.release.set()
        assert (await third).status == 200
    assert registry.get_sample_value("apiserver_flowcontrol_rejected_requests_total", {**labels, "reason": "time-out"}) == 1
    waited = registry.get_sample_value("apiserver_flowcontrol_request_wait_duration_seconds_count", {**labels, "execute": "true"})
    assert waited == 4
    assert registry.get_sample_value("apiserver_flowcontrol_current_inqueue_requests", labels) == 0


async def test_a_watch_holds_its_seat_only_while_it_starts(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str
) -> None:
    proxied, held = await one_seat(start_proxied, apiservices_dir)
    watch = Watch()
    proxied.backend.routes[f"{PREFIX}/namespaces/default/widgets"] = watch
    held.release.set()
    async with client(pki, proxied.server.port, PROTOCOLS[1], alice) as as_alice:
        h2 = as_alice._h2
        assert h2 is not None
        sid = h2.request("GET", f"{PREFIX}/namespaces/default/widgets?watch=1")
        await until(lambda: watch.open == 1, what="the watch open at the backend")
        await h2.until(lambda: h2.streams[sid].status is not None)
        head = h2.streams[sid]
        assert head.header(PL_UID) == TENANTS_PL  # a watch is classified, and says so
        # the only seat is free again: a GET runs at once, twice
        assert (await as_alice.request("GET", THINGS)).status == 200
        assert (await as_alice.request("GET", THINGS)).status == 200
    sample = proxied.server.gateway.metrics.registry.get_sample_value
    labels = {"priority_level": "tenants", "flow_schema": "tenants"}
    assert sample("apiserver_flowcontrol_request_execution_seconds_count", {**labels, "type": "watch"}) == 1
    assert sample("apiserver_flowcontrol_dispatched_requests_total", labels) == 3


async def test_masters_are_exempt_and_long_running_requests_other_than_watches_pass_untracked(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str
) -> None:
    proxied, held = await one_seat(start_proxied, apiservices_dir)
    logs = Held()
    proxied.backend.routes[THINGS + "/a/log"] = logs
    async with client(pki, proxied.server.port, PROTOCOLS[0], alice) as as_alice, client(
        pki, proxied.server.port, PROTOCOLS[0], "admin"
    ) as admin:
        first = asyncio.create_task(as_alice.request("GET", THINGS))
        await until(lambda: held.arrived == 1, what="alice's GET at the backend")
        by_admin = asyncio.create_task(admin.request("GET", THINGS))
        await until(lambda: held.arrived == 2, what="the admin's GET at the backend, beside alice's")
        log = asyncio.create_task(as_alice.request("GET", THINGS + "/a/log"))
        await until(lambda: logs.arrived == 1, what="alice's log request at the backend: not queued")
        held.release.set()
        logs.release.set()
        answers = [await first, await by_admin, await log]
    assert [a.status for a in answers] == [200, 200, 200]
    assert answers[2].uids == (None, None)  # a log stream is not classified (upstream's long-running check)


async def test_without_priority_and_fairness_nothing_is_classified(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str
) -> None:
    tenants(apiservices_dir)
    proxied = await start_proxied(enable_priority_and_fairness=False)
    async with client(pki, proxied.server.port, PROTOCOLS[0], alice) as as_alice:
        answer = await as_alice.request("GET", THINGS)
    assert answer.status == 200 and answer.uids == (None, None)
    assert proxied.server.gateway.flowcontrol is None


async def test_the_apiservice_bulkhead_still_refuses_past_its_own_limit(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str, backend: Any, backend_pki: Any
) -> None:
    """`aggregator.dev/max-concurrent-requests` beside APF: APF admits (plenty of seats), the
    APIService's bulkhead refuses what passes its own limit, and its 429 names APF's classification."""
    manifest = apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem)
    manifest["metadata"]["annotations"] = {"aggregator.dev/max-concurrent-requests": "1"}
    write_manifests(apiservices_dir, "demo", manifest, *backend_service(backend.port))
    tenants(apiservices_dir)
    proxied = await start_proxied(manifests=False)
    await wait_available(proxied.server)
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with client(pki, proxied.server.port, PROTOCOLS[0], "admin") as admin:
        first = asyncio.create_task(admin.request("GET", THINGS))
        await until(lambda: held.arrived == 1, what="the first GET at the backend")
        refused = await admin.request("GET", THINGS)
        assert refused.status == 429 and refused.uids[1] == uid_of(PRIORITY_LEVEL, "exempt")
        assert b"already has 1 requests in flight (its aggregator.dev/max-concurrent-requests)" in refused.body
        held.release.set()
        assert (await first).status == 200


async def test_an_invalid_flow_schema_in_the_folder_is_named_with_its_file_and_field_and_the_others_apply(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, alice: str, bob: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aggregator.flowcontrol.sources")
    bad = flow_schema("for-bob", "tenants", users=("bob",), uid="fs-bob")
    bad["spec"]["matchingPrecedence"] = -5
    path = write_manifests(
        apiservices_dir,
        "apf",
        priority_level("tenants", uid=TENANTS_PL),
        flow_schema("tenants", "tenants", users=("alice",), uid=TENANTS_FS),
        bad,
    )
    proxied = await start_proxied()
    refusals = [r for r in caplog.records if "manifest refused" in r.getMessage()]
    assert len(refusals) == 1
    fields = refusals[0].fields  # type: ignore[attr-defined]
    assert fields["file"] == str(path) and fields["name"] == "for-bob" and fields["document"] == 2
    assert fields["reason"] == (
        'FlowSchema.flowcontrol.apiserver.k8s.io "for-bob" is invalid: spec.matchingPrecedence: Invalid value: -5: '
        "must be a positive value"
    )
    # as every file the gateway does not load: /readyz?verbose warns, aggregator_manifest_errors counts
    registry = proxied.server.gateway.metrics.registry
    assert registry.get_sample_value("aggregator_manifest_errors", {"file": str(path)}) == 1
    warning = f"warn: manifest {path}: {fields['reason']} (refused)\n"

    async def warned() -> bool:
        async with proxied.request("GET", "/readyz?verbose") as resp:
            return warning in await resp.text()

    await until_async(warned, what="the warning in /readyz?verbose")  # once the first checks are in
    port = proxied.server.port
    async with client(pki, port, PROTOCOLS[0], alice) as as_alice, client(pki, port, PROTOCOLS[0], bob) as as_bob:
        assert (await as_alice.request("GET", THINGS)).uids == (TENANTS_FS, TENANTS_PL)
        assert (await as_bob.request("GET", THINGS)).uids[0] == uid_of(FLOW_SCHEMA, "global-default")
        # fixed in place: applied on the next reload
        bad["spec"]["matchingPrecedence"] = 600
        write_manifests(
            apiservices_dir,
            "apf",
            priority_level("tenants", uid=TENANTS_PL),
            flow_schema("tenants", "tenants", users=("alice",), uid=TENANTS_FS),
            bad,
        )
        flowcontrol = proxied.server.gateway.flowcontrol
        assert flowcontrol is not None
        await until(lambda: any(s.name == "for-bob" for s in flowcontrol.controller.schemas), what="the fixed FlowSchema")
        assert (await as_bob.request("GET", THINGS)).uids == ("fs-bob", TENANTS_PL)
    assert registry.get_sample_value("aggregator_manifest_errors", {"file": str(path)}) is None
