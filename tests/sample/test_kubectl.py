"""Real kubectl binaries against the sample server, through a minimal in-test front proxy.

What kubectl needs from an aggregated API server: discovery (aggregated v2/v2beta1 or legacy),
Table output, OpenAPI v3 with `fieldValidation` on PATCH (server-side validation), and for 1.27/1.28
the OpenAPI v2 document as protobuf, fetched before every create and for explain.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sample_apiserver import SampleServer

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.tls.issue import load_pair
from tests.sample.frontproxy import FrontProxy
from tests.support.e2e import FLUNDER, Kubectl, kubectl_binaries
from tests.support.pki import PKI
from tests.support.polling import until

KUBECTLS = kubectl_binaries()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed")]


@pytest.fixture
async def proxy(sample: SampleServer, pki: PKI) -> AsyncIterator[FrontProxy]:
    front = FrontProxy(pki, sample.url)
    await front.start()
    try:
        yield front
    finally:
        await front.stop()


def _config(pki: PKI, proxy: FrontProxy, tmp_path: Path, stem: str = "admin") -> Path:
    path = tmp_path / f"{stem}.kubeconfig"
    write_kubeconfig(
        path,
        kubeconfig(proxy.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, stem), user=stem),
    )
    return path


@pytest.mark.parametrize("binary", KUBECTLS, ids=lambda b: Path(b).name)
async def test_kubectl_workflow(binary: str, proxy: FrontProxy, pki: PKI, tmp_path: Path) -> None:
    kubectl = Kubectl(binary, _config(pki, proxy, tmp_path), tmp_path / "home")

    _, out, _ = await kubectl("api-resources", "--api-group=wardle.example.com")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert lines[1].split() == ["fischers", "fi", "wardle.example.com/v1alpha1", "false", "Fischer"]
    assert lines[2].split() == ["flunders", "fl", "wardle.example.com/v1beta1", "true", "Flunder"]

    (tmp_path / "flunder.yaml").write_text(FLUNDER)
    _, out, _ = await kubectl("create", "-f", str(tmp_path / "flunder.yaml"))
    assert out.strip() == "flunder.wardle.example.com/my-flunder created"
    creates = [s for s in proxy.seen if s.method == "POST"]
    assert "fieldValidation=Strict" in creates[-1].path_qs  # server-side validation was chosen

    _, out, _ = await kubectl("get", "fl")
    assert out.split()[:2] == ["NAME", "AGE"] and out.splitlines()[1].startswith("my-flunder")
    _, out, _ = await kubectl("get", "flunders", "-o", "wide")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "AGE", "REFERENCE", "TYPE", "REFERENCE"]
    assert row.split()[0] == "my-flunder" and row.split()[2:] == ["Fischer", "fred"]
    _, out, _ = await kubectl(
        "get", "flunders.v1alpha1.wardle.example.com", "my-flunder", "-o", "jsonpath={.spec.reference}"
    )
    assert out == "fred"

    _, out, _ = await kubectl("explain", "flunders.spec")
    assert (
        "fischerReference" in out
        and "A name of a fischer, mutually exclusive to the FlunderReference." in out
    )

    _, out, _ = await kubectl("patch", "fl", "my-flunder", "-p", '{"spec":{"fischerReference":"wilma"}}')
    assert "patched" in out
    _, out, _ = await kubectl(
        "get", "fl", "my-flunder", "-o", "jsonpath={.spec.fischerReference} {.metadata.generation}"
    )
    assert out == "wilma 2"

    code, _, err = await kubectl("create", "-f", str(tmp_path / "flunder.yaml"), check=False)
    assert code != 0 and 'flunders.wardle.example.com "my-flunder" already exists' in err
    (tmp_path / "bad.yaml").write_text(
        FLUNDER.replace("name: my-flunder", "name: bad").replace(
            "fischerReference: fred", "fischerReference: fred\n  colour: red"
        )
    )
    code, _, err = await kubectl("create", "-f", str(tmp_path / "bad.yaml"), check=False)
    assert code != 0 and 'unknown field "spec.colour"' in err

    _, out, _ = await kubectl("delete", "fl", "my-flunder")
    assert out.strip() == 'flunder.wardle.example.com "my-flunder" deleted'


async def test_kubectl_watch_sees_events(proxy: FrontProxy, pki: PKI, tmp_path: Path) -> None:
    kubectl = Kubectl(KUBECTLS[0], _config(pki, proxy, tmp_path), tmp_path / "home")
    process = await asyncio.create_subprocess_exec(
        kubectl.binary,
        "--kubeconfig",
        str(kubectl.config),
        "get",
        "flunders",
        "--watch",
        "--request-timeout=20s",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    try:
        assert process.stdout is not None
        await until(lambda: any("watch=true" in s.path_qs for s in proxy.seen), 20, "the watch established")
        await kubectl("create", "-f", "-", stdin=FLUNDER)
        header = await asyncio.wait_for(process.stdout.readline(), 20)
        row = await asyncio.wait_for(process.stdout.readline(), 20)
        assert header.split() == [b"NAME", b"AGE"]
        assert row.split()[0] == b"my-flunder"
    finally:
        process.terminate()
        await process.wait()


async def test_second_user_without_rights_is_refused(proxy: FrontProxy, pki: PKI, tmp_path: Path) -> None:
    pki.issue_user("bob", "bob", ("devs",))
    kubectl = Kubectl(KUBECTLS[0], _config(pki, proxy, tmp_path, "bob"), tmp_path / "home-bob")
    code, out, err = await kubectl("get", "flunders", check=False)
    assert code != 0
    assert (
        'Error from server (Forbidden): flunders.wardle.example.com is forbidden: User "bob" cannot list resource '
        '"flunders" in API group "wardle.example.com" in the namespace "default"'
    ) in err
    _, out, _ = await kubectl("api-resources", "--api-group=wardle.example.com")  # discovery stays readable
    assert "flunders" in out
