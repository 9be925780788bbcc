"""The demo's processes: they die with it however it ends, and a second demo names the first one's pid.

`aggregator demo` is started as `make demo` starts it (a subprocess in the checkout), its process
tree read from /proc, then the demo is killed with SIGKILL: the sample, the gateway and the
gateway's worker processes must all be gone, and the port free, without anyone stopping them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aggregator.commands.demofiles import port_in_use
from aggregator.util import parentdeath
from tests.support.polling import until_blocking
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
EXIT_TIMEOUT = 30.0

pytestmark = [
    pytest.mark.long(15),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
]


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that is gone counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class RunningDemo:
    process: subprocess.Popen[bytes]
    port: int
    out: Path
    err: Path

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()


def start_demo(workdir: Path, certs: Path, port: int) -> RunningDemo:
    out, err = workdir / f"demo-{port}.out", workdir / f"demo-{port}.err"
    with out.open("wb") as out_file, err.open("wb") as err_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "demo", "--dir", str(certs), "--secure-port", str(port)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out_file,
            stderr=err_file,
        )
    return RunningDemo(process, port, out, err)


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str | Callable[[], str], demo: RunningDemo | None = None
) -> None:
    def said() -> str:
        return (what() if callable(what) else what) + (f":\n{demo.output()}" if demo else "")

    until_blocking(predicate, timeout, said, every=0.1)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[RunningDemo]:
    running = start_demo(tmp_path, tmp_path / "certs", free_port())
    try:
        wait_for(lambda: "Press Ctrl-C" in running.out.read_text(), START_TIMEOUT, "the banner", running)
        yield running
    finally:
        if running.process.poll() is None:
            running.process.send_signal(signal.SIGINT)
            running.process.wait(timeout=EXIT_TIMEOUT)


def test_a_second_demo_names_the_first_and_every_process_of_the_first_dies_with_it(
    demo: RunningDemo, tmp_path: Path
) -> None:
    # A second demo on the folder names the pid holding it, whatever port it asks for, even the busy
    # one: the lock is taken before the ports are chosen.
    for port in (demo.port, free_port()):
        second = start_demo(tmp_path, tmp_path / "certs", port)
        assert second.process.wait(timeout=START_TIMEOUT) == 1, second.output()
        assert (
            f"another aggregator demo (pid {demo.process.pid}) is using {tmp_path / 'certs'}"
            in second.err.read_text()
        ), second.output()
    assert (tmp_path / "certs" / "demo" / ".lock").read_text() == f"{demo.process.pid}\n"

    tree = descendants(demo.process.pid)
    commands = {pid: command_line(pid) for pid in tree}
    sample = [p for p, c in commands.items() if "-m sample_apiserver" in c]
    gateway = [p for p, c in commands.items() if "-m aggregator serve" in c]
    workers = [p for p, c in commands.items() if "-m aggregator.runners.worker" in c]
    assert len(sample) == 1 and len(gateway) == 1, commands
    if len(os.sched_getaffinity(0)) >= 2:
        # The gateway's default is a worker per CPU it may use: a control process and its workers.
        assert len(workers) >= 2, commands

    demo.process.kill()  # SIGKILL: the demo cannot stop anything itself
    demo.process.wait(timeout=EXIT_TIMEOUT)
    wait_for(
        lambda: not [p for p in tree if alive(p)],
        EXIT_TIMEOUT,
        lambda: f"the demo's processes to exit: {[commands[p] for p in tree if alive(p)]}",
    )
    assert not port_in_use("127.0.0.1", demo.port)


def test_a_command_started_after_its_parent_died_does_not_run(tmp_path: Path) -> None:
    """The race parentdeath closes: the parent is gone before the signal could be armed."""
    marker = tmp_path / "ran"
    # Our own pid is never the parent of the wrapper's process (the shell that starts it is).
    argv = parentdeath.command(os.getpid(), ["touch", str(marker)])
    done = subprocess.run(["sh", "-c", shlex.join(argv) + "; true"], timeout=30)
    assert done.returncode == 0 and not marker.exists()
    # Started by the named parent, it runs.
    subprocess.run(parentdeath.command(os.getpid(), ["touch", str(marker)]), check=True, timeout=30)
    assert marker.exists()
