"""Discovery quarantine, as a user meets it: a dead metrics-server behind the gateway, real kubectl.

With `aggregator.dev/discovery-quarantine-after` on its APIService, `kubectl api-resources` and
`kubectl get --raw /apis` exit 0 without metrics.k8s.io once it has been unavailable that long
(legacy and aggregated `/apis`, `/apis/<group>`, OpenAPI v2 and the v3 index), its own requests
still answer 503, and it is back the moment it is Available again. Without the annotation, the
gateway behaves as kube-aggregator: the group stays, Stale, which client-go's DiscoveryClient
(Helm, controllers) reports as a failed group-version. Kube mode (the shipped configuration, `--workers 2` and 1) and local mode
(`--workers` unset, and 1); a tiny duration, waited on, never slept out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.tls.issue import load_pair
from tests.support.backend import BackendPKI, FakeBackend
from tests.support.e2e import Kubectl, kubectl_binaries
from tests.support.kubestack import KubeStack
from tests.support.metricsapi import (
    GROUP,
    GROUP_VERSION,
    POD_METRICS_PATH,
    aggregated_versions,
    legacy_groups,
    metrics_backend,
    metrics_manifests,
)
from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.support.ports import free_port
from tests.workers.group import running_group

KUBECTLS = sorted(
    (b for b in kubectl_binaries(every_version=True) if re.search(r"kubectl\.1\.\d+$", b)),
    key=lambda b: int(b.rsplit(".", 1)[1]),
)
# The oldest and the newest kubectl the suite drives (1.27 and 1.33 beside kubectl's real file).
NEWEST, OLDEST = (KUBECTLS[-1], KUBECTLS[0]) if KUBECTLS else ("", "")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not KUBECTLS, reason="kubectl 1.<minor> is not installed")]
AGGREGATED = {"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}
RESOURCES = {"APIService": "apiservices", "Service": "services", "EndpointSlice": "endpointslices"}

Get = Callable[..., Awaitable[tuple[int, bytes]]]


async def discovery_lists_metrics(get: Get) -> tuple[bool, str]:
    """(listed in the legacy /apis, its freshness in the aggregated one: "" when not listed). With
    workers the two may differ for a moment: a worker renders the legacy one, the control the other."""
    status, legacy = await get("/apis")
    assert status == 200, legacy
    status, aggregated = await get("/apis", headers=AGGREGATED)
    assert status == 200, aggregated
    return GROUP in legacy_groups(legacy), aggregated_versions(aggregated).get(GROUP_VERSION, "")


async def in_openapi(get: Get) -> tuple[bool, bool]:
    """(in the v3 index, its paths in the merged v2)."""
    _, index = await get("/openapi/v3")
    _, v2 = await get("/openapi/v2", headers={"Accept": "application/json"})
    return f"apis/{GROUP_VERSION}" in json.loads(index)["paths"], POD_METRICS_PATH in json.loads(v2)["paths"]


async def quarantined(get: Get) -> bool:
    await get(f"/apis/{GROUP_VERSION}")  # what clients do: a failed request has availability look now
    listed, freshness = await discovery_lists_metrics(get)
    return not listed and not freshness and await in_openapi(get) == (False, False)


async def available(get: Get) -> bool:
    await get(f"/apis/{GROUP_VERSION}")  # it answers 503 until a check finds it back
    listed, freshness = await discovery_lists_metrics(get)
    return listed and freshness == "Current" and await in_openapi(get) == (True, True)


async def kubectl_sees_the_quarantine(kubectl: Kubectl) -> None:
    code, out, err = await kubectl("api-resources", check=False)
    assert code == 0, err
    assert GROUP not in out and "flunders" in out, out
    _, out, _ = await kubectl("get", "--raw", "/apis")
    assert GROUP not in [g["name"] for g in json.loads(out)["groups"]]
    code, _, err = await kubectl("get", "--raw", f"/apis/{GROUP_VERSION}", check=False)
    assert code != 0 and "ServiceUnavailable" in err, err


async def back_when_available(get: Get, backend: FakeBackend, kubectl: Kubectl) -> None:
    """The backend comes up; a request to it has availability check it now, and the group is back."""
    await backend.start()
    await until_async(lambda: available(get), timeout=30, what="metrics.k8s.io back in discovery and OpenAPI")
    code, out, err = await kubectl("api-resources", "--api-group", GROUP, check=False)
    assert code == 0 and "PodMetrics" in out, (out, err)


@pytest.mark.parametrize(("binary", "workers"), [(NEWEST, 2), (OLDEST, 1)], ids=["newest-workers=2", "oldest-workers=1"])
async def test_kube_mode_a_quarantined_dead_metrics_server_leaves_discovery_and_comes_back(
    binary: str, workers: int, pki: PKI, backend_pki: BackendPKI, tmp_path: Path
) -> None:
    async with KubeStack(pki, tmp_path, workers=workers) as stack:
        port = free_port()
        for doc in metrics_manifests(port, quarantine_after="100ms"):
            stack.kube.add_object(RESOURCES[doc["kind"]], doc)
        front_proxy_ca = str(stack.kube.dir / "front-proxy-ca.crt")
        alive = metrics_backend(backend_pki, front_proxy_ca, port)
        await alive.start()
        try:
            await stack.start_gateway()
            await until_async(lambda: available(stack.get), timeout=30, what="metrics.k8s.io served")
        finally:
            await alive.stop()  # metrics-server dies

        await until_async(lambda: quarantined(stack.get), timeout=30, what="metrics.k8s.io quarantined")
        kubectl = stack.kubectl(binary)
        await kubectl_sees_the_quarantine(kubectl)
        status, body = await stack.get(f"/apis/{GROUP}")
        assert status == 404, body  # not kube-apiserver's APIGroup for it
        assert "APIService quarantined" in stack.served.log()

        backend = metrics_backend(backend_pki, front_proxy_ca, port)
        try:
            await back_when_available(stack.get, backend, kubectl)
        finally:
            await backend.stop()
        assert "APIService out of quarantine" in stack.served.log()


async def test_kube_mode_without_the_annotation_the_dead_group_stays_stale_as_upstream(
    pki: PKI, tmp_path: Path
) -> None:
    async with KubeStack(pki, tmp_path, workers=2) as stack:
        for doc in metrics_manifests(free_port()):
            stack.kube.add_object(RESOURCES[doc["kind"]], doc)
        await stack.start_gateway()

        async def stale() -> bool:
            await stack.get(f"/apis/{GROUP_VERSION}")
            listed, freshness = await discovery_lists_metrics(stack.get)
            return listed and freshness == "Stale"

        await until_async(stale, timeout=30, what="metrics.k8s.io listed as Stale")
        # kubectl's disk-cached discovery drops Stale group-versions before it lists resources, so
        # it exits 0 here as against kube-apiserver; client-go's plain DiscoveryClient (Helm,
        # controllers) fails on the Stale entry instead (ErrGroupDiscoveryFailed).
        code, out, err = await stack.kubectl(NEWEST)("api-resources", check=False)
        assert code == 0 and "PodMetrics" not in out and "flunders" in out, (code, err)
        _, out, _ = await stack.kubectl(NEWEST)("get", "--raw", "/apis")
        assert GROUP in [g["name"] for g in json.loads(out)["groups"]]
        status, body = await stack.get(f"/apis/{GROUP}")
        assert status == 200 and json.loads(body)["name"] == GROUP
        assert "APIService quarantined" not in stack.served.log()


@pytest.mark.parametrize("workers", [None, 1], ids=["workers-unset", "workers=1"])
async def test_local_mode_a_quarantined_dead_metrics_server_leaves_discovery_and_comes_back(
    workers: int | None, pki: PKI, backend_pki: BackendPKI, tmp_path: Path
) -> None:
    folder = tmp_path / "apiservices"
    folder.mkdir()
    port = free_port()
    (folder / "metrics.json").write_text(
        json.dumps({"kind": "List", "apiVersion": "v1", "items": metrics_manifests(port, quarantine_after="100ms")})
    )
    extra = ["--workers", str(workers)] if workers is not None else []
    async with running_group(pki, folder, tmp_path / "gateway.log", *extra) as group:
        await until_async(lambda: quarantined(group.get), timeout=30, what="metrics.k8s.io quarantined")
        config = tmp_path / "admin.kubeconfig"
        write_kubeconfig(config, kubeconfig(group.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, "admin")))
        kubectl = Kubectl(NEWEST, config, tmp_path / "home")
        code, out, err = await kubectl("api-resources", check=False)
        assert code == 0 and GROUP not in out and "apiservices" in out, (out, err)
        _, out, _ = await kubectl("get", "--raw", "/apis")
        assert GROUP not in [g["name"] for g in json.loads(out)["groups"]]
        code, _, err = await kubectl("get", "--raw", f"/apis/{GROUP_VERSION}", check=False)
        assert code != 0 and "ServiceUnavailable" in err, err
        # The condition says so (local mode serves apiregistration.k8s.io itself).
        _, out, _ = await kubectl("get", "apiservice", "v1beta1.metrics.k8s.io", "-o", "json")
        available = next(c for c in json.loads(out)["status"]["conditions"] if c["type"] == "Available")
        assert available["status"] == "False" and "quarantined: left out of discovery" in available["message"]
        status, metrics = await group.get("/metrics")
        assert status == 200, metrics
        assert 'aggregator_apiservice_discovery_quarantined{apiservice="v1beta1.metrics.k8s.io"} 1.0' in metrics.decode()

        backend = metrics_backend(backend_pki, pki.path("front-proxy-ca.crt"), port)
        try:
            await back_when_available(group.get, backend, kubectl)
        finally:
            await backend.stop()
