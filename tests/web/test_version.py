"""`/version` in local mode: a Kubernetes version kubectl accepts, with the gateway's own inside."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from aggregator import __version__
from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.tls.issue import load_pair
from aggregator.web.version import KUBERNETES_VERSION, build_metadata
from tests.conftest import StartGateway
from tests.support.e2e import Kubectl, kubectl_binaries, kubectl_minor
from tests.support.pki import PKI

EVERY_KUBECTL = kubectl_binaries(every_version=True)
SKEW_WARNING = "exceeds the supported minor version skew"


def test_build_metadata_is_valid_semver_whatever_the_version_string() -> None:
    assert build_metadata("0.1.0") == "aggregator.0.1.0"
    assert build_metadata("1.2.0rc1+local_build") == "aggregator.1.2.0rc1-local-build"
    assert build_metadata("2..0.dev3") == "aggregator.2.0.dev3"


async def test_metrics_carry_the_build_info(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/metrics", ssl=pki.client_context()) as resp,
    ):
        text = await resp.text()
    (line,) = [line for line in text.splitlines() if line.startswith("aggregator_build_info{")]
    # labelled like kubernetes_build_info, from /version: the API level, and the gateway's version
    assert f'git_version="v1.33.0+aggregator.{__version__}"' in line
    assert 'major="1"' in line and 'minor="33"' in line
    assert line.endswith(" 1.0")


@pytest.mark.e2e
@pytest.mark.skipif(not EVERY_KUBECTL, reason="kubectl is not installed")
@pytest.mark.parametrize("binary", EVERY_KUBECTL, ids=lambda b: Path(b).name)
async def test_kubectl_version_warns_only_about_real_skew(
    binary: str, start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    """No warning within one minor of the Kubernetes level the gateway follows (kubectl's own rule);
    an older kubectl is told the truth, as it would be by a kube-apiserver of that level."""
    server = await start_gateway()
    config = tmp_path / "kubeconfig"
    write_kubeconfig(
        config, kubeconfig(server.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, "admin"))
    )
    kubectl = Kubectl(binary, config, tmp_path / "home")
    _, out, err = await kubectl("version")
    assert f"v1.33.0+aggregator.{__version__}" in out
    client = await kubectl_minor(binary)
    _, server_minor, _ = KUBERNETES_VERSION
    if abs(client - server_minor) <= 1:
        assert SKEW_WARNING not in err, err
    else:
        assert f"version difference between client (1.{client}) and server (1.33) {SKEW_WARNING}" in err
    _, out, _ = await kubectl("version", "-o", "json")
    server_version = json.loads(out)["serverVersion"]
    assert (server_version["minor"], server_version["gitVersion"]) == (
        "33",
        f"v1.33.0+aggregator.{__version__}",
    )
