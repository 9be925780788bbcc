"""The README, followed by a newcomer: a fresh copy of the repository, `make demo` in a pseudo-terminal,
and the README's commands, as printed, from another shell in the checkout.

The copy holds what a clone of this checkout would (tracked files, and new files not ignored yet),
so no `.venv`, no certificates: `make demo` creates both. Its install takes packages from a
wheelhouse instead of the network: in CI the one `.ci/run` filled for the project's own install
(`PIP_FIND_LINKS`, `PIP_NO_INDEX`), elsewhere one this test fills once with pip (from pip's cache)
and keeps in `.venv/newcomer-wheelhouse/`.

The demo runs on a pseudo-terminal, as in a terminal window: it reads Enter from it, and Ctrl-C is
the terminal's SIGINT to the foreground process group (make and the demo).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aggregator.commands.demofiles import port_in_use
from tests.support.e2e import kubectl_binaries
from tests.support.polling import until_blocking
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# The whole test, install included, stays under this.
BUDGET = 420.0
INSTALL_TIMEOUT = 300.0

pytestmark = [
    pytest.mark.long(90),
    pytest.mark.e2e,
    pytest.mark.skipif(not kubectl_binaries(), reason="kubectl is not installed"),
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout: nothing to clone"),
]


def readme_block(name: str) -> list[str]:
    """The commands of the README's block marked `<!-- tested: name -->`, comments stripped."""
    found = re.search(rf"<!-- tested: {re.escape(name)} -->\n```sh\n(.*?)```", README.read_text(), re.S)
    assert found, f"README.md has no block marked {name!r}"
    return [line.split("  #", 1)[0].strip() for line in found[1].splitlines() if line.strip()]


# --- the fresh copy and its packages ------------------------------------------------------------------


def fresh_copy(destination: Path) -> Path:
    """What `git clone` of this checkout would give, with uncommitted changes."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / name.decode()
        if source.is_file():
            target = destination / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)
    return destination


def runtime_requirements() -> list[str]:
    """What `make demo` installs from the index: the gateway's and the sample server's own
    requirements (the sample's `aggregator` is the checkout itself)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    sample = tomllib.loads((REPO / "samples" / "wardle" / "pyproject.toml").read_text())
    return [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *(r for r in sample["project"]["dependencies"] if r != project["project"]["name"]),
    ]


def wheelhouse_env() -> dict[str, str]:
    """pip's settings for an install from a wheelhouse: CI's, or one built here once."""
    if os.environ.get("PIP_FIND_LINKS") and os.environ.get("PIP_NO_INDEX"):
        return {}
    requirements = runtime_requirements()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    house = REPO / ".venv" / "newcomer-wheelhouse"
    marker = house / f".complete-{key}"
    if not marker.exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
             "--wheel-dir", str(house), *requirements],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"no wheelhouse to install the fresh copy from, and pip could not fill one: {done.stderr[-500:]}")
        marker.touch()
    return {"PIP_FIND_LINKS": str(house), "PIP_NO_INDEX": "1"}


# --- the demo on a pseudo-terminal -----------------------------------------------------------------------


@dataclass
class Terminal:
    """`make demo` with a pseudo-terminal for its stdin, stdout and stderr."""

    process: subprocess.Popen[bytes]
    master: int
    output: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def text(self) -> str:
        with self.lock:
            return self.output.decode(errors="replace")

    def read_forever(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return  # the terminal's other side is closed: everyone exited
            if not chunk:
                return
            with self.lock:
                self.output += chunk

    def wait_for(self, text: str, timeout: float) -> float:
        def printed() -> bool:
            assert self.process.poll() is None, f"make demo exited:\n{self.text()}"
            return text in self.text()

        return until_blocking(printed, timeout, lambda: f"{text!r}:\n{self.text()}", every=0.1)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to its foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[tuple[Terminal, Path, int]]:
    checkout = fresh_copy(tmp_path / "aggregator")
    port = free_port()
    env = {**os.environ, **wheelhouse_env(), "TERM": "xterm", "HOME": str(tmp_path / "home")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(REPO)))
    master, slave = os.openpty()
    process = subprocess.Popen(
        ["make", "demo", f"DEMO_ARGS=--secure-port {port}"],
        cwd=checkout,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    os.close(slave)
    term = Terminal(process, master)
    reader = threading.Thread(target=term.read_forever, name="pty-reader", daemon=True)
    reader.start()
    try:
        yield term, checkout, port
    finally:
        if process.poll() is None:
            term.ctrl_c()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        os.close(master)
        reader.join(timeout=10)


# --- the README's commands, from another shell -----------------------------------------------------------


@dataclass
class Shell:
    checkout: Path
    home: Path
    exports: list[str] = field(default_factory=list)

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        if line.startswith("export "):
            self.exports.append(line)
            return subprocess.CompletedProcess(line, 0, "", "")
        script = "; ".join([*self.exports, line])
        env = {**os.environ, "HOME": str(self.home), "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"}
        env.pop("KUBECONFIG", None)
        return subprocess.run(
            ["bash", "-c", script], cwd=self.checkout, capture_output=True, text=True, timeout=60, env=env
        )


def until(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> float:
    return until_blocking(check, timeout, what, every=0.2)


def test_a_newcomer_follows_the_readme(terminal: tuple[Terminal, Path, int], tmp_path: Path) -> None:
    started = time.monotonic()
    term, checkout, port = terminal
    # make demo: the demo's packages only, with progress, then the banner.
    term.wait_for("make demo: installing", 60)
    install = term.wait_for("make demo: installed", INSTALL_TIMEOUT)
    assert "Successfully installed" in term.text() and "aggregator" in term.text()
    term.wait_for("Press Ctrl-C", 120)
    venv_python = checkout / ".venv" / "bin" / "python"
    # The kube, test and dev extras are not the demo's (local mode never imports kubernetes).
    for extra in ("kubernetes", "pytest", "mypy", "ruff", "hypothesis"):
        assert subprocess.run([venv_python, "-c", f"import {extra}"], capture_output=True).returncode != 0
    assert f"https://127.0.0.1:{port}" in term.text()
    assert "it keeps its objects in memory" in term.text()

    shell = Shell(checkout, tmp_path / "home-2")
    said: dict[str, subprocess.CompletedProcess[str]] = {}
    for line in readme_block("readme-try"):
        said[line] = done = shell.run(line)
        if "alice" not in line:
            assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    refused = next(v for k, v in said.items() if "alice" in k)
    assert refused.returncode != 0 and (
        'Error from server (Forbidden): flunders.wardle.example.com is forbidden: User "alice" cannot list '
        'resource "flunders" in API group "wardle.example.com" in the namespace "default"'
    ) in refused.stderr, refused.stderr
    resources = said["kubectl api-resources"].stdout
    assert re.search(r"^flunders\s+fl\s+wardle.example.com/v1beta1\s+true\s+Flunder$", resources, re.M), resources
    assert said["kubectl create -f examples/flunder.yaml"].stdout.strip() == (
        "flunder.wardle.example.com/my-first-flunder created"
    )
    assert "my-first-flunder" in said["kubectl get flunders"].stdout
    rows = [line.split() for line in said["kubectl get apiservices"].stdout.splitlines()[1:]]
    assert sorted((row[0], row[2]) for row in rows) == [
        ("v1alpha1.wardle.example.com", "True"),
        ("v1beta1.wardle.example.com", "True"),
    ]
    check = next(v for k, v in said.items() if " check --all " in k)
    assert [line.split()[0] for line in check.stdout.splitlines()[1:]] == ["✓", "✓"], check.stdout

    # Break it, as the README says.
    kill, raw_beta, raw_alpha, apiservices, check_line = readme_block("readme-failure")
    assert shell.run(kill).returncode == 0
    term.wait_for("the sample server exited", 30)
    for line in (raw_beta, raw_alpha):
        done = shell.run(line)
        assert done.returncode != 0 and "Error from server (ServiceUnavailable)" in done.stderr, done.stderr
    listed: list[subprocess.CompletedProcess[str]] = []

    def both_false() -> bool:
        listed.append(shell.run(apiservices))
        rows = [line.split() for line in listed[-1].stdout.splitlines()[1:]]
        return len(rows) == 2 and all(row[2] == "False" and row[3].startswith("(FailedDiscoveryCheck)") for row in rows)

    # "within a second" of the failed requests: the re-check they asked for, plus the time to ask
    # (each kubectl run takes a second or more on a loaded machine); the periodic check is 30 s away.
    took = until(both_false, 20, lambda: listed[-1].stdout + listed[-1].stderr)
    assert took < 15, took
    print(f"newcomer: both APIServices False {took:.1f}s after the failed requests")
    done = shell.run(check_line)
    assert done.returncode != 0 and [line.split()[0] for line in done.stdout.splitlines()[1:]] == ["✗", "✗"], (
        done.stdout
    )

    # Enter starts the sample again; Ctrl-C stops everything and frees the port.
    term.type(b"\n")
    term.wait_for("wardle.example.com is available again", 60)
    term.ctrl_c()
    assert term.process.wait(timeout=60) is not None
    until(lambda: "aggregator demo: stopped" in term.text(), 10, term.text)
    until(lambda: not port_in_use("127.0.0.1", port), 30, lambda: f"port {port} still held")
    elapsed = time.monotonic() - started
    print(f"newcomer: install {install:.0f}s, whole walk {elapsed:.0f}s")
    assert elapsed < BUDGET
