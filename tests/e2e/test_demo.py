"""`aggregator demo` as a newcomer runs it, driven by the real kubectl (PATH, oldest and newest).

One demo process for the module: the sample wardle server behind a local-mode gateway, started
exactly as `make demo` starts it, and stopped with Ctrl-C at the end. The failure walk-through of
docs/demo.md runs on a demo of its own: the sample killed, the gateway still serving and saying
which hop fails, then Enter and everything Current and True again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from aggregator.commands.wardle import local_manifests
from tests.support.e2e import Kubectl, kubectl_binaries
from tests.support.polling import until, until_async, until_blocking
from tests.support.ports import free_port

KUBECTLS = kubectl_binaries()
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.long(55),
    pytest.mark.e2e,
    pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed"),
]


@dataclass(frozen=True)
class Demo:
    certs: Path
    port: int
    log: Path
    banner: str

    def banner_line(self, needle: str) -> str:
        (line,) = [line.strip() for line in self.banner.splitlines() if needle in line]
        return line

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
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            return "Press Ctrl-C" in out.read_text()

        until_blocking(up, 60, lambda: "the demo to come up:\n" + log.read_text(), every=0.2)
        banner = out.read_text()
        assert f"https://127.0.0.1:{port}" in banner
        assert "kubectl --kubeconfig" in banner and "api-resources" in banner
        assert "it keeps its objects in memory, so they are gone when it restarts" in banner
        yield Demo(workdir / "certs", port, log, banner)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    assert "aggregator demo: stopped" in log.read_text()


async def wait_available(kubectl: Kubectl) -> None:
    """The availability checker marks both APIServices Available shortly after start."""
    conditions: dict[str, dict[str, str]] = {}

    async def available() -> bool:
        _, out, _ = await kubectl("get", "apiservices", "-o", "json")
        conditions.clear()
        for item in json.loads(out)["items"]:
            found = item.get("status", {}).get("conditions", [])
            conditions[item["metadata"]["name"]] = {c["type"]: c["status"] for c in found}
        return all(c.get("Available") == "True" for c in conditions.values()) and len(conditions) == 2

    await until_async(available, 30, lambda: f"both APIServices available: {conditions}", every=0.5)


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
async def test_local_mode_has_no_core_or_built_in_groups(demo: Demo, binary: str, tmp_path: Path) -> None:
    """The README's word: in local mode `/api` and the built-in groups answer 404."""
    kubectl = demo.kubectl(binary, tmp_path)
    for path in ("/api", "/apis/apps/v1"):
        code, _, err = await kubectl("get", "--raw", path, check=False)
        assert (code, err) == (1, "Error from server (NotFound): the server could not find the requested resource\n")
    code, _, err = await kubectl("get", "pods", check=False)
    assert err == 'error: the server doesn\'t have a resource type "pods"\n', err


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
    columns = out.splitlines()[0].split()
    assert columns[0] == "NAME" and "AGE" in columns and len(columns) > 2
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
        "-v=6",  # logs each response's status: the watch's once the server has started it
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(kubectl.home)},
    )
    assert watcher.stderr is not None
    log: list[str] = []

    async def read_log(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            log.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read_log(watcher.stderr))
    try:
        await until(
            lambda: any("watch=true" in line and "200 OK" in line for line in log),
            20,
            lambda: "the watch started:\n" + "".join(log),
        )
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
        await reader
        await kubectl("delete", "flunder", name, "--ignore-not-found")


async def proxied_refusals(demo: Demo) -> float:
    """How many 403s the sample server answered through the gateway (`aggregator_proxy_requests_total`)."""
    ctx = ssl.create_default_context(cafile=str(demo.certs / "ca.crt"))
    ctx.load_cert_chain(str(demo.certs / "admin.crt"), str(demo.certs / "admin.key"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{demo.port}/metrics", ssl=ctx) as resp,
    ):
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("aggregator_proxy_requests_total{") and 'code="403"' in line
    )


FORBIDDEN_LIST = (
    'Error from server (Forbidden): flunders.wardle.example.com is forbidden: User "alice" cannot list '
    'resource "flunders" in API group "wardle.example.com" in the namespace "default"'
)
FORBIDDEN_AS = (
    'Error from server (Forbidden): users "x" is forbidden: User "alice" cannot impersonate resource "users" '
    'in API group "" at the cluster scope'
)


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_alice_is_refused_by_the_gateways_rbac_with_and_without_as(
    demo: Demo, binary: str, tmp_path: Path
) -> None:
    """The README's walk-through: the demo's RBAC manifests let alice read fischers and nothing
    else, and the refusals come from the gateway (the sample never sees them)."""
    admin = demo.kubectl(binary, tmp_path)
    await wait_available(admin)
    alice = demo.kubectl(binary, tmp_path, user="alice")
    refusals = await proxied_refusals(demo)
    _, out, err = await alice("get", "fischers")  # allowed by the gateway and served by the sample
    assert "No resources found" in err or out.startswith("NAME")
    code, _, err = await alice("get", "flunders", check=False)
    assert code != 0 and FORBIDDEN_LIST in err
    code, _, err = await alice("--as=x", "--as-group=system:masters", "get", "flunders", check=False)
    assert code != 0 and FORBIDDEN_AS in err
    code, _, err = await alice("create", "-f", str(REPO / "examples" / "flunder.yaml"), check=False)
    assert code != 0 and "Forbidden" in err
    assert await proxied_refusals(demo) == refusals  # every refusal was the gateway's own


@pytest.mark.parametrize("binary", KUBECTLS)
async def test_kubectl_auth_can_i_asks_the_gateway(demo: Demo, binary: str, tmp_path: Path) -> None:
    alice = demo.kubectl(binary, tmp_path, user="alice")
    assert (await alice("auth", "can-i", "list", "fischers"))[1].strip() == "yes"
    code, out, _ = await alice("auth", "can-i", "list", "flunders", check=False)
    assert (code, out.strip()) == (1, "no")
    code, out, _ = await alice("auth", "can-i", "impersonate", "users", check=False)
    assert (code, out.strip()) == (1, "no")
    _, listed, _ = await alice("auth", "can-i", "--list")
    rows = {line.split()[0]: line for line in listed.splitlines()[1:] if line.strip()}
    assert rows["fischers.wardle.example.com"].endswith("[get list watch]")
    assert "flunders.wardle.example.com" not in rows
    admin = demo.kubectl(binary, tmp_path)
    assert (await admin("auth", "can-i", "delete", "flunders"))[1].strip() == "yes"
    # as someone else: the impersonation is checked, then the question is asked as them
    code, _, err = await alice("auth", "can-i", "list", "fischers", "--as=x", check=False)
    assert code != 0 and "cannot impersonate" in err


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


def shell(command: str, home: Path) -> subprocess.CompletedProcess[str]:
    """A line of the banner, pasted into a shell in the checkout."""
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        ["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=60, env=env
    )


async def test_the_banner_commands_work_as_printed(demo: Demo, tmp_path: Path) -> None:
    export = demo.banner_line("export KUBECONFIG=")
    check = demo.banner_line(" check --all ")
    kubectl = await wait_available_via_shell(export, tmp_path)
    assert kubectl.returncode == 0, kubectl.stderr
    done = shell(f"{export} && {check}", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[1]: line.split()[0] for line in done.stdout.splitlines()[1:]}
    assert rows == {"v1alpha1.wardle.example.com": "✓", "v1beta1.wardle.example.com": "✓"}
    assert "note: using the front-proxy client certificate" in done.stderr


async def wait_available_via_shell(export: str, home: Path) -> subprocess.CompletedProcess[str]:
    said: list[subprocess.CompletedProcess[str]] = []

    async def available() -> bool:
        said.append(done := shell(f"{export} && kubectl get apiservices", home))
        rows = [line.split() for line in done.stdout.splitlines()[1:]]
        return done.returncode == 0 and bool(rows) and all(row[2] == "True" for row in rows)

    await until_async(available, 30, lambda: said[-1].stdout + said[-1].stderr, every=0.5)
    return said[-1]


async def test_a_second_demo_on_a_busy_port_or_the_same_folder_touches_nothing(
    demo: Demo, tmp_path: Path
) -> None:
    """The running demo keeps working: its manifests and kubeconfigs are left exactly as they were."""
    watched = [demo.certs / "demo" / "apiservices" / "wardle.yaml", demo.certs / "demo.kubeconfig"]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in watched]
    other = tmp_path / "other-certs"
    for folder, port, message in (
        (demo.certs, demo.port, "another aggregator demo (pid"),  # the lock is taken before the ports
        (demo.certs, free_port(), "another aggregator demo (pid"),
        (other, demo.port, f"port {demo.port} on 127.0.0.1 is in use"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "aggregator",
                "demo",
                "--dir",
                str(folder),
                "--secure-port",
                str(port),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 1 and message in done.stderr, done.stderr
        assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in watched] == before
    assert not (other / "demo" / "apiservices").exists() and not (other / "demo.kubeconfig").exists()
    await wait_available(demo.kubectl(KUBECTLS[0], tmp_path))


AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
WARDLE = ("v1alpha1.wardle.example.com", "v1beta1.wardle.example.com")


class DemoProcess:
    """A demo of its own, driven through its stdin and read from its stdout."""

    def __init__(self, certs: Path, port: int, workdir: Path) -> None:
        self.certs, self.port = certs, port
        self.out, self.log = workdir / "demo.out", workdir / "demo.log"
        with self.log.open("wb") as err_file, self.out.open("wb") as out_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "aggregator", "demo", "--dir", str(certs), "--secure-port", str(port)],
                stdin=subprocess.PIPE,
                stdout=out_file,
                stderr=err_file,
                cwd=REPO,
            )

    async def wait_for_output(self, text: str, timeout: float = 60) -> None:
        def printed() -> bool:
            assert self.proc.poll() is None, self.out.read_text() + self.log.read_text()
            return text in self.out.read_text()

        await until(printed, timeout, lambda: f"{text!r} in:\n" + self.out.read_text(), every=0.1)

    def press_enter(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=30)

    async def get(self, path: str, accept: str = "application/json") -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        ctx.load_cert_chain(str(self.certs / "admin.crt"), str(self.certs / "admin.key"))
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{self.port}{path}", ssl=ctx, headers={"Accept": accept}) as resp,
        ):
            return resp.status, await resp.text()

    async def freshness(self) -> dict[str, str]:
        _, body = await self.get("/apis", AGGREGATED)
        items = {i["metadata"]["name"]: i for i in json.loads(body)["items"]}
        return {v["version"]: v.get("freshness", "Current") for v in items["wardle.example.com"]["versions"]}

    async def wait_for_freshness(self, freshness: str) -> None:
        """Until both wardle versions in `/apis` are `freshness` (Stale or Current)."""
        seen: list[dict[str, str]] = []

        async def reached() -> bool:
            seen.append(await self.freshness())
            return seen[-1] == {"v1beta1": freshness, "v1alpha1": freshness}

        await until_async(reached, 10, lambda: f"both versions {freshness}: {seen[-1]}", every=0.1)


async def available(kubectl: Kubectl) -> dict[str, str]:
    _, out, _ = await kubectl("get", "apiservices")
    return {line.split()[0]: line.split()[2] for line in out.splitlines()[1:]}


async def test_the_sample_dies_the_gateway_says_so_and_recovers(tmp_path: Path) -> None:
    """docs/demo.md's 'see a failure' walk-through, with manifests the user edited beforehand."""
    certs = tmp_path / "certs"
    subprocess.run(
        [sys.executable, "-m", "aggregator", "certs", "init", "--dir", str(certs)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    sample_port = free_port()
    docs = local_manifests((certs / "ca.crt").read_bytes(), sample_port)
    docs[0]["metadata"]["labels"] = {"edited-by": "me"}
    manifests = certs / "demo" / "apiservices" / "wardle.yaml"
    manifests.parent.mkdir(parents=True)
    manifests.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    edited = manifests.read_bytes()

    demo = DemoProcess(certs, free_port(), tmp_path)
    try:
        await demo.wait_for_output("Press Ctrl-C")
        assert f"kept {manifests}: it was changed after the demo wrote it" in demo.out.read_text()
        assert manifests.read_bytes() == edited
        assert "Press Enter here to start it again." in demo.out.read_text()
        kubectl = Kubectl(KUBECTLS[0], certs / "demo.kubeconfig", tmp_path / "home")
        await wait_available(kubectl)  # the sample listens where the user's manifests say
        await kubectl("get", "flunders")  # kubectl caches discovery with wardle.example.com in it

        first_pid = int((certs / "demo" / "sample.pid").read_text())
        os.kill(first_pid, signal.SIGKILL)
        await demo.wait_for_output("the sample server exited (killed by SIGKILL); the gateway keeps serving")

        # The first requests fail with the hop named, and have the gateway re-check at once. (Raw
        # paths: kubectl's own discovery may already see the group Stale if a periodic check ran.)
        refused = (
            f"error trying to reach service: dial tcp 127.0.0.1:{sample_port}: connect: connection refused"
        )
        for path in (
            "/apis/wardle.example.com/v1beta1/flunders",
            "/apis/wardle.example.com/v1alpha1/fischers",
        ):
            code, _, err = await kubectl("get", "--raw", path, check=False)
            assert code != 0, err
            # ("service unavailable" if a periodic check got there first)
            assert err.strip() in (
                f"Error from server (ServiceUnavailable): {m}" for m in (refused, "service unavailable")
            )
        now: list[dict[str, str]] = []

        async def both_false() -> bool:
            now.append(await available(kubectl))
            return now[-1] == {name: "False" for name in WARDLE}

        # within 20 s: the re-check the failed requests asked for, not the periodic one 30 s away
        await until_async(both_false, 20, lambda: f"both APIServices False: {now[-1]}", every=0.1)
        await demo.wait_for_freshness("Stale")
        # docs/demo.md's answers 2 and 3 of `kubectl get flunders`: with the discovery kubectl cached
        # before the kill, the gateway's own 503; once kubectl reads discovery again, no such type.
        code, _, err = await kubectl("get", "flunders", check=False)
        assert err == "Error from server (ServiceUnavailable): service unavailable\n", err
        await kubectl("api-resources")
        code, _, err = await kubectl("get", "flunders", check=False)
        assert err == 'error: the server doesn\'t have a resource type "flunders"\n', err
        for binary in KUBECTLS:
            stale = Kubectl(binary, kubectl.config, tmp_path / f"home-{Path(binary).name}")
            # client-go leaves Stale groups out, silently: the rest is listed, exit 0, no error.
            code, out, err = await stale("api-resources")
            assert "flunders" not in out and "apiservices" in out and err == "", (binary, out, err)
            code, _, err = await stale("get", "flunders", check=False)
            assert err == 'error: the server doesn\'t have a resource type "flunders"\n', (binary, err)
            # What says why: the group-version itself, and the APIService.
            code, _, err = await stale("get", "--raw", "/apis/wardle.example.com/v1beta1", check=False)
            assert err == "Error from server (ServiceUnavailable): service unavailable\n", (binary, err)

        check = shell(
            next(line.strip() for line in demo.out.read_text().splitlines() if " check --all " in line),
            tmp_path,
        )
        assert check.returncode == 1
        rows = {line.split()[1]: line.split() for line in check.stdout.splitlines()[1:]}
        for name in WARDLE:
            assert rows[name][0] == "✗" and "connect" in rows[name], check.stdout

        status, metrics = await demo.get("/metrics", "text/plain")
        assert status == 200
        for name in WARDLE:
            assert f'aggregator_unavailable_apiservice{{name="{name}"}} 1.0' in metrics
        assert (
            'aggregator_backend_errors_total{apiservice="v1beta1.wardle.example.com",kind="connect"}'
            in metrics
        )
        assert demo.proc.poll() is None

        # Enter: the sample is back on the same port, and everything with it.
        demo.press_enter()
        await demo.wait_for_output("wardle.example.com is available again", timeout=30)
        assert int((certs / "demo" / "sample.pid").read_text()) != first_pid
        assert await available(kubectl) == {name: "True" for name in WARDLE}
        await demo.wait_for_freshness("Current")
        await kubectl("get", "flunders,fischers")
        assert manifests.read_bytes() == edited
    finally:
        code = demo.stop()
    assert code == 0, demo.log.read_text()[-3000:]
