"""Kube mode as it ships, with 1 and 2 workers: `aggregator serve` against the fake kube-apiserver,
no CA flags (the cluster's `extension-apiserver-authentication` decides), the sample wardle server
as the aggregated backend. Every request goes on a fresh connection, so with `--workers 2` the
kernel hands them to both workers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubestack import WARDLE_ADMINS, KubeStack
from tests.support.pki import PKI
from tests.support.polling import until, until_async

pytestmark = pytest.mark.long(50)

FLUNDERS = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders"
# Enough fresh connections that two workers both answer (each lands on either with p=1/2).
SPREAD = 24


@pytest.fixture(params=[1, 2], ids=["workers=1", "workers=2"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
async def stack(pki: PKI, tmp_path: Path, workers: int) -> AsyncIterator[KubeStack]:
    async with KubeStack(pki, tmp_path, workers=workers) as stack:
        await stack.start_gateway()
        yield stack


async def answering_workers(stack: KubeStack, requests: int = SPREAD) -> set[int | None]:
    """The workers (pids) that answered `requests` fresh connections."""
    return {await stack.served.worker_pid() for _ in range(requests)}


async def test_a_client_certificate_from_the_clusters_ca_lists_an_aggregated_resource(
    stack: KubeStack, workers: int
) -> None:
    """The admin certificate's CA is only in the ConfigMap's `client-ca-file`: every worker takes it."""
    for _ in range(SPREAD):
        status, body = await stack.get(FLUNDERS)
        assert status == 200, body.decode()
        assert json.loads(body)["kind"] == "FlunderList"
    assert len(await answering_workers(stack)) == workers


async def test_front_proxy_headers_and_tokens_and_a_changed_configmap(stack: KubeStack) -> None:
    """The front-proxy CA, allowed names and header names come from the ConfigMap too; bearer
    tokens from TokenReview; a changed ConfigMap holds on every worker from then on."""
    kube, reviews = stack.kube, stack.reviews
    assert reviews is not None
    proxy_cert, proxy_key = kube.issue_front_proxy_cert()
    proxy = (str(proxy_cert), str(proxy_key))
    rogue_cert, rogue_key = kube.issue_front_proxy_cert("rogue-proxy")
    rogue = (str(rogue_cert), str(rogue_key))
    reviews.add_user("ops-token", "ops", groups=(WARDLE_ADMINS,))
    as_jane = {"X-Remote-User": "jane", "X-Remote-Group": WARDLE_ADMINS}
    for _ in range(SPREAD // 4):
        assert (await stack.get(FLUNDERS, cert=proxy, headers=as_jane))[0] == 200
        # jane without the group: the sample's own refusal, so the identity reached it as sent
        status, body = await stack.get(FLUNDERS, cert=proxy, headers={"X-Remote-User": "jane"})
        assert status == 403 and b'User \\"jane\\" cannot list resource \\"flunders\\"' in body, body
        assert (await stack.get(FLUNDERS, cert=rogue, headers=as_jane))[0] == 401  # not an allowed name
        assert (await stack.get(FLUNDERS, token="ops-token"))[0] == 200
        assert (await stack.get(FLUNDERS, token="nobody"))[0] == 401

    kube.publish_authentication(username_headers=["X-Auth-User"], group_headers=["X-Auth-Group"])
    as_jane = {"X-Auth-User": "jane", "X-Auth-Group": WARDLE_ADMINS}

    async def taken_everywhere() -> bool:
        answers = [(await stack.get(FLUNDERS, cert=proxy, headers=as_jane))[0] for _ in range(SPREAD)]
        return answers == [200] * SPREAD

    await until_async(taken_everywhere, what="the new header names on every worker")
    assert (await stack.get(FLUNDERS, cert=proxy, headers={"X-Remote-User": "jane"}))[0] == 401


BETA = "v1beta1.wardle.example.com"


def _sum(metrics: str, name: str, *labels: str) -> float:
    """The sum of every series of `name` whose labels include all of `labels`."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_configmap_written_long_ago_is_listed_once_and_watched(
    pki: PKI, tmp_path: Path, workers: int
) -> None:
    """As on a real cluster: the ConfigMap's own resourceVersion is long compacted when the gateway
    starts. It is listed once and watched from the list's version (no 410 relist loop), and every
    worker takes a client certificate its CA signed."""
    async with KubeStack(pki, tmp_path, workers=workers) as stack:
        kube = stack.kube
        kube.expire_history()
        await stack.start_gateway()
        await until(lambda: kube.open_watches("configmaps") == 1, what="the ConfigMap's watch")
        assert kube.count("list", "configmaps") == 1
        for _ in range(SPREAD):
            assert (await stack.get(FLUNDERS))[0] == 200
        assert len(await answering_workers(stack)) == workers
        assert kube.count("list", "configmaps") == 1 and kube.open_watches("configmaps") == 1
        assert "list/watch failed" not in stack.served.log()


async def test_status_writes_under_the_lease_metrics_audit_and_shutdown(
    pki: PKI, tmp_path: Path, workers: int
) -> None:
    """The control alone probes, holds the Lease and writes status (once per change, whatever the
    worker count); every worker serves the group's metrics and feeds the one audit log; SIGTERM
    drains the group, releases the Lease, exit 0."""
    policy = tmp_path / "audit-policy.yaml"
    policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n")
    audit_log = tmp_path / "audit.log"
    args = ["--write-apiservice-status", "--audit-policy-file", str(policy), "--audit-log-path", str(audit_log)]
    async with KubeStack(pki, tmp_path, workers=workers, gateway_args=args) as stack:
        kube = stack.kube
        served = await stack.start_gateway()

        def written() -> list[str]:
            """The Available status of each status write of v1beta1, in order (the fake's history)."""
            return [
                c["status"]
                for event in kube.history
                if event.resource == "apiservices" and event.obj["metadata"]["name"] == BETA
                for c in event.obj.get("status", {}).get("conditions", [])
                if c["type"] == "Available"
            ]

        try:
            await until_async(_async(lambda: written() == ["True"]), what="Available=True written")
        except AssertionError as err:
            raise AssertionError(f"{err}: written {written()}; the gateway's log:\n{served.log()}") from None
        lease = kube.get_object("leases", "aggregator", "default")
        assert lease is not None and lease["spec"]["holderIdentity"]
        status, body = await stack.get("/readyz?verbose")
        assert status == 200 and b"leading lease default/aggregator" in body, body

        for _ in range(SPREAD):
            assert (await stack.get(FLUNDERS))[0] == 200
        status, body = await stack.get("/metrics")
        assert status == 200
        metrics = body.decode()
        assert _sum(metrics, "apiserver_request_total", 'resource="flunders"', 'verb="LIST"') >= SPREAD
        assert _sum(metrics, "aggregator_unavailable_apiservice", f'name="{BETA}"') == 0
        if workers > 1:
            assert f"aggregator_workers {workers:.1f}" in metrics
            for worker in ("control", *map(str, range(workers))):
                assert f'process_resident_memory_bytes{{worker="{worker}"}}' in metrics

        # the backend dies: a request fails, the control re-checks at once and writes the flip once
        assert stack.sample is not None
        await stack.sample.stop()
        assert (await stack.get(FLUNDERS))[0] == 503
        await until_async(_async(lambda: written() == ["True", "False"]), what="Available=False written")

        async def refused_everywhere() -> bool:
            answers = [await stack.get(FLUNDERS) for _ in range(SPREAD)]
            return all(s == 503 and b"service unavailable" in b for s, b in answers)

        await until_async(refused_everywhere, what="every worker to refuse from the new verdict")
        status, body = await stack.get("/metrics")
        assert _sum(body.decode(), "aggregator_unavailable_apiservice", f'name="{BETA}"') == 1

        def listed() -> list[dict[str, Any]]:
            events = [json.loads(line) for line in audit_log.read_text().splitlines()]
            return [
                e for e in events
                if e["stage"] == "ResponseComplete" and str(e["requestURI"]).startswith(FLUNDERS)
            ]  # fmt: skip

        await until_async(_async(lambda: len(listed()) >= SPREAD + 1 + SPREAD), what="every request audited")
        assert {e["user"]["username"] for e in listed()} == {"kubernetes-admin"}

        assert await served.stop() == 0
        assert written() == ["True", "False"]
        lease = kube.get_object("leases", "aggregator", "default")
        assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released
        log = served.log()
        assert "Traceback" not in log
        assert log.count("shutting down") >= 1 + (workers if workers > 1 else 0)


def _async(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check
