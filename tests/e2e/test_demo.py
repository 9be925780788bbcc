"""`aggregator demo` as a newcomer runs it, driven by the real kubectl (PATH, oldest and newest).

One demo process for the module: the sample wardle server behind a local-mode gateway, started
exactly as `make demo` starts it, and stopped with Ctrl-C at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.e2e import Kubectl, kubectl_binaries
from tests.support.ports import free_port

KUBECTLS = kubectl_binaries()
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed")]


@dataclass(frozen=True)
class Demo:
    certs: Path
    port: int
    log: Path

    def kubectl(self, binary: str, tmp_path: Path, user: str = "admin") -> Kubectl:
        config = self.certs / ("demo.kubeconfig" if user == "admin" else f"{user}.kubeconfig")
        return Kubectl(binary, config, tmp_path / f"home-{Path(binary).name}-{user}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    workdir = tmp_path_factory.mktemp("demo")
    port = free_port()
    log = workdir / "demo.log"
    out = workdir / "demo.out"
    with log.open("wb") as err_file, out.open("wb") as out_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator",
                "demo",
                "--dir",
                str(workdir / "certs"),
                "--secure-port",
                str(port),
            ],
            stdout=out_file,
            stderr=err_file,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 60
        while "Press Ctrl-C" not in out.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "demo did not come up:\n" + log.read_text()
            time.sleep(0.2)
        banner = out.read_text()
        assert f"https://127.0.0.1:{port}" in banner
        assert "kubectl --kubeconfig" in banner and "api-resources" in banner
        yield Demo(workdir / "certs", port, log)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    assert "aggregator demo: stopped" in log.read_text()


async def wait_available(kubectl: Kubectl) -> None:
    """The availability checker marks both APIServices Available shortly after start."""
    deadline = time.monotonic() + 30
    while True:
        _, out, _ = await kubectl("get", "apiservices", "-o", "json")
        conditions = {
            item["metadata"]["name"]: {
                c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])
            }
            for item in json.loads(out)["items"]
        }
        if all(c.get("Available") == "True" for c in conditions.values()) and len(conditions) == 2:
            return
        assert time.monotonic() < deadline, f"APIServices not available: {conditions}"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_api_resources_lists_wardle_resources(demo: Demo, binary: str, tmp_path: Path) -> None:
    kubectl = demo.kubectl(binary, tmp_path)
    _, out, _ = await kubectl("api-resources")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["flunders"] == ["flunders", "fl", "wardle.example.com/v1beta1", "true", "Flunder"]
    assert rows["fischers"] == ["fischers", "fi", "wardle.example.com/v1alpha1", "false", "Fischer"]
    assert rows["apiservices"] == ["apiservices", "apiregistration.k8s.io/v1", "false", "APIService"]
    _, wardle, _ = await kubectl("api-resources", "--api-group=wardle.example.com", "-o", "name")
    assert wardle.split() == ["fischers.wardle.example.com", "flunders.wardle.example.com"]


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_get_raw_apis_is_the_merged_group_list(demo: Demo, binary: str, tmp_path: Path) -> None:
    kubectl = demo.kubectl(binary, tmp_path)
    _, out, _ = await kubectl("get", "--raw", "/apis")
    doc = json.loads(out)
    assert doc["kind"] == "APIGroupList"
    assert [g["name"] for g in doc["groups"]] == ["apiregistration.k8s.io", "wardle.example.com"]
    wardle = doc["groups"][1]
    assert [v["version"] for v in wardle["versions"]] == ["v1beta1", "v1alpha1"]
    assert wardle["preferredVersion"] == {"groupVersion": "wardle.example.com/v1beta1", "version": "v1beta1"}


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_flunder_lifecycle(demo: Demo, binary: str, tmp_path: Path) -> None:
    kubectl = demo.kubectl(binary, tmp_path)
    await wait_available(kubectl)
    name = f"flunder-{Path(binary).name.replace('.', '-')}"
    manifest = yaml.safe_load((REPO / "examples" / "flunder.yaml").read_text())
    manifest["metadata"]["name"] = name
    path = tmp_path / "flunder.yaml"
    path.write_text(yaml.safe_dump(manifest))

    _, out, _ = await kubectl("create", "-f", str(path))
    assert out.strip() == f"flunder.wardle.example.com/{name} created"

    _, out, _ = await kubectl("get", "flunder", name)
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "AGE"] and row.split()[0] == name

    _, out, _ = await kubectl("get", "flunders", "-o", "wide")
    header = out.splitlines()[0].split()
    assert header[0] == "NAME" and "AGE" in header and len(header) > 2
    assert any(line.split()[0] == name for line in out.splitlines()[1:])

    _, out, _ = await kubectl("get", "flunder", name, "-o", "yaml")
    obj = yaml.safe_load(out)
    assert obj["kind"] == "Flunder" and obj["apiVersion"] == "wardle.example.com/v1beta1"
    assert obj["spec"] == {"referenceType": "Fischer", "fischerReference": "some-fischer"}
    assert obj["metadata"]["labels"] == {"sample": "demo"}

    _, out, _ = await kubectl(
        "patch", "flunder", name, "--type=merge", "-p", '{"metadata":{"labels":{"patched":"yes"}}}'
    )
    assert out.strip() == f"flunder.wardle.example.com/{name} patched"
    _, out, _ = await kubectl("patch", "flunder", name, "-p", '{"spec":{"fischerReference":"other-fischer"}}')
    assert out.strip() == f"flunder.wardle.example.com/{name} patched"
    _, out, _ = await kubectl("get", "flunder", name, "-o", "json")
    obj = json.loads(out)
    assert obj["metadata"]["labels"]["patched"] == "yes"
    assert obj["spec"]["fischerReference"] == "other-fischer"

    _, out, _ = await kubectl("delete", "flunder", name)
    assert out.strip() == f'flunder.wardle.example.com "{name}" deleted'
    code, _, err = await kubectl("get", "flunder", name, check=False)
    assert code != 0
    assert f'flunders.wardle.example.com "{name}" not found' in err


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_watch_sees_an_event(demo: Demo, binary: str, tmp_path: Path) -> None:
    kubectl = demo.kubectl(binary, tmp_path)
    await wait_available(kubectl)
    name = f"watched-{Path(binary).name.replace('.', '-')}"
    watcher = await asyncio.create_subprocess_exec(
        binary,
        "--kubeconfig",
        str(kubectl.config),
        "get",
        "flunders",
        "--watch",
        "--output-watch-events",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(kubectl.home)},
    )
    try:
        await asyncio.sleep(1.5)  # let the watch start
        await kubectl(
            "create",
            "-f",
            "-",
            stdin=f"apiVersion: wardle.example.com/v1beta1\nkind: Flunder\nmetadata:\n  name: {name}\n",
        )
        assert watcher.stdout is not None
        deadline = time.monotonic() + 20
        seen = ""
        while name not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"watch saw no event; got {seen!r}"
            line = await asyncio.wait_for(watcher.stdout.readline(), remaining)
            seen += line.decode()
        event = next(line.split() for line in seen.splitlines() if name in line)
        assert event[:2] == ["ADDED", name], seen
    finally:
        watcher.kill()
        await watcher.wait()
        await kubectl("delete", "flunder", name, "--ignore-not-found")


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_a_user_without_rights_is_refused(demo: Demo, binary: str, tmp_path: Path) -> None:
    admin = demo.kubectl(binary, tmp_path)
    await wait_available(admin)
    alice = demo.kubectl(binary, tmp_path, user="alice")
    code, _, err = await alice("get", "flunders", check=False)
    assert code != 0
    assert (
        'Error from server (Forbidden): flunders.wardle.example.com is forbidden: User "alice" cannot list '
        'resource "flunders" in API group "wardle.example.com" in the namespace "default"'
    ) in err
    code, _, err = await alice("create", "-f", str(REPO / "examples" / "flunder.yaml"), check=False)
    assert code != 0 and "Forbidden" in err


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_get_apiservices_shows_availability(demo: Demo, binary: str, tmp_path: Path) -> None:
    kubectl = demo.kubectl(binary, tmp_path)
    await wait_available(kubectl)
    _, out, _ = await kubectl("get", "apiservices")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SERVICE", "AVAILABLE", "AGE"]
    rows = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert rows == {
        "v1alpha1.wardle.example.com": ["wardle/api", "True"],
        "v1beta1.wardle.example.com": ["wardle/api", "True"],
    }
