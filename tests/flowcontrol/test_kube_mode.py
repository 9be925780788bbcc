"""Kube mode: the cluster's FlowSchemas and priority levels, listed and watched, classify requests;
the answers name the cluster's objects by their UIDs (the fake kube-apiserver holds the bootstrap
objects kube-apiserver's ensurer creates, each with its own resourceVersion and UID)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.flowcontrol.sources import CHECK_NAME, KubeConfig
from tests.flowcontrol.client import PROTOCOLS, Answer, client
from tests.flowcontrol.support import flow_schema
from tests.support.fakekube import FLOWSCHEMAS, PRIORITY_LEVELS, FakeKube, kube_options
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until, until_async


def uids(answer: Answer) -> tuple[str | None, str | None]:
    return answer.uids


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_the_clusters_objects_classify_and_a_new_flow_schema_applies_as_it_is_watched(
    fake_kube: FakeKube, pki: PKI, tmp_path: Path, protocol: str
) -> None:
    assert fake_kube.kubeconfig is not None
    alice = pki.issue_user("alice", "alice")
    global_default: dict[str, Any] | None = fake_kube.get_object(FLOWSCHEMAS, "global-default")
    level = fake_kube.get_object(PRIORITY_LEVELS, "global-default")
    workload_high = fake_kube.get_object(PRIORITY_LEVELS, "workload-high")
    assert global_default and level and workload_high
    options = kube_options(pki, fake_kube.kubeconfig, authentication_skip_lookup=True)
    async with running_gateway(options) as server:
        flowcontrol = server.gateway.flowcontrol
        assert flowcontrol is not None
        source = flowcontrol.source
        assert isinstance(source, KubeConfig)
        await until(lambda: source.synced, what="the cluster's APF objects listed")
        checks = {c.name for c in server.gateway.health.checks_for("readyz")}
        assert CHECK_NAME in checks
        async with client(pki, server.port, protocol, alice) as as_alice:
            answer = await as_alice.request("GET", "/apis/wardle.example.com/v1alpha1/flunders")
            assert uids(answer) == (global_default["metadata"]["uid"], level["metadata"]["uid"])

            added = fake_kube.add_object(
                FLOWSCHEMAS, flow_schema("alice-first", "workload-high", precedence=300, users=("alice",), uid="uid-alice-first")
            )
            assert int(added["metadata"]["resourceVersion"]) > int(global_default["metadata"]["resourceVersion"])

            async def moved() -> bool:
                answer = await as_alice.request("GET", "/apis/wardle.example.com/v1alpha1/flunders")
                return uids(answer) == ("uid-alice-first", workload_high["metadata"]["uid"])

            await until_async(moved, what="alice's requests in the new FlowSchema")
            fake_kube.delete_object(FLOWSCHEMAS, "alice-first")

            async def back() -> bool:
                answer = await as_alice.request("GET", "/apis/wardle.example.com/v1alpha1/flunders")
                return bool(uids(answer)[0] == global_default["metadata"]["uid"])

            await until_async(back, what="alice's requests back in global-default")
