"""Kube mode: `--write-apiservice-status` PUTs the status subresource once per change, never per check."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from aggregator.availability import AvailabilityChecker
from aggregator.availability.conditions import passed, service_not_found
from aggregator.availability.status import ALWAYS_LEADS, KubeStatusWriter
from aggregator.kube.client import KubeClient
from aggregator.model.apiservice import ServiceReference, decode_apiservice
from aggregator.server import GatewayServer, build_gateway
from tests.availability.conftest import StartBackend
from tests.proxy.support import (
    APISERVICE,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.fakekube import FakeKube, kube_options
from tests.support.pki import PKI

WRITES = ("update", "apiservices/status")


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


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
            gateway = build_gateway(opts)
            checker = gateway.availability
            assert isinstance(checker, AvailabilityChecker)
            checker.interval, checker.retry_initial = 0.05, 0.05
            checker.probe.timeout = 1.0
            server = GatewayServer(opts, gateway)
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
        writer = KubeStatusWriter(client, _EmptyStore(), ALWAYS_LEADS)  # type: ignore[arg-type]
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


class _EmptyStore:
    """The writer falls back to the object it is given when the store does not have it."""

    def apiservice(self, name: str) -> None:
        return None
