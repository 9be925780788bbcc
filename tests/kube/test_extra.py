"""The kubernetes client is the `kube` extra: local mode runs without it, and anything that needs
it (kube mode, a kubeconfig) stops at start with one line naming the extra.

The extra's absence is made real for the processes under test (and the workers they start) by a
`kubernetes` package ahead of site-packages whose import fails, as a missing one would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pki import PKI
from tests.workers.group import running_group

pytestmark = pytest.mark.long(20)

MISSING = "it is the package's kube extra, pip install 'aggregator[kube]'"


@pytest.fixture
def without_kubernetes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment (this test's and its children's) in which `import kubernetes` fails."""
    shadow = tmp_path / "no-kube-extra" / "kubernetes"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'kubernetes'\")\n")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return {**os.environ}


def aggregator(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_kube_mode_without_the_extra_stops_at_start_naming_it(
    without_kubernetes: dict[str, str], pki: PKI, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    proxy = ["--proxy-client-cert-file", pki.path("front-proxy-client.crt")]
    proxy += ["--proxy-client-key-file", pki.path("front-proxy-client.key")]
    serve = aggregator(without_kubernetes, "serve", "--kubeconfig", str(kubeconfig), *proxy, "--secure-port", "0")
    assert serve.returncode == 2, serve.stderr
    (line,) = serve.stderr.strip().splitlines()
    assert line.startswith("aggregator serve: kube mode: needs the kubernetes client, which is not installed")
    assert line.endswith(MISSING)
    # Local mode asking kube-apiserver for reviews needs it too.
    objects = tmp_path / "objects"
    objects.mkdir()
    local = aggregator(
        without_kubernetes, "serve", "--apiservices-dir", str(objects), "--kubeconfig", str(kubeconfig)
    )
    assert local.returncode == 2 and local.stderr.startswith("aggregator serve: --kubeconfig: needs the kubernetes")
    check = aggregator(without_kubernetes, "check", "--all", "--kubeconfig", str(kubeconfig))
    assert check.returncode == 2 and check.stderr.strip().endswith(MISSING), check.stderr


async def test_local_mode_serves_without_the_extra(
    without_kubernetes: dict[str, str], pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    """Ready, and `/readyz` answered by a worker: no process of the group imported kubernetes."""
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", "--workers", "2") as group:
        status, body = await group.get("/readyz?verbose")
        assert status == 200, body
        assert b"info: worker" in body
    assert "kubernetes" not in group.log()
