"""Kube mode as it ships, with 1 and 2 workers: `aggregator serve` against the fake kube-apiserver,
no CA flags (the cluster's `extension-apiserver-authentication` decides), the sample wardle server
as the aggregated backend. Every request goes on a fresh connection, so with `--workers 2` the
kernel hands them to both workers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.kubestack import KubeStack
from tests.support.pki import PKI

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
