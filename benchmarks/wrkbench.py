"""Shared helpers for the wrk benchmarks: run a gateway in a subprocess and measure one URL with wrk.

Figures are only comparable within one run on one machine, so every benchmark measures a baseline in
the same run and prints the ratio.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


@dataclass(frozen=True)
class WrkResult:
    label: str
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int

    def line(self) -> str:
        return (
            f"{self.label:<32} {self.requests_per_second:>10.0f} req/s   p50 {self.p50_ms:>7.2f} ms   "
            f"p99 {self.p99_ms:>7.2f} ms   errors {self.errors}"
        )


def _ms(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(label: str, output: str) -> WrkResult:
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", output)
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE)
    if not (rps and p50 and p99):
        raise RuntimeError(f"could not read wrk output:\n{output}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", output))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors += int(non2xx.group(1)) if non2xx else 0
    return WrkResult(label, float(rps.group(1)), _ms(p50.group(1)), _ms(p99.group(1)), errors)


def pinning(cpus: str | None) -> list[str]:
    """`taskset -c <cpus>` where the machine has taskset and CPUs to spare, else nothing."""
    if cpus is None or not shutil.which("taskset"):
        return []
    return ["taskset", "-c", cpus]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (the control and its workers)."""
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                queue += [int(child) for child in (task / "children").read_text().split()]
    return pids


def tree_cpu(pid: int) -> float:
    total = 0.0
    for member in tree(pid):
        with contextlib.suppress(OSError, IndexError):
            total += cpu_seconds(member)
    return total


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_for_http(url: str, body: bytes, timeout: float = 30.0) -> None:
    """Until a plain-HTTP GET of `url` answers 200 with `body`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                got = resp.read()
                if resp.status == 200 and got == body:
                    return
                last = (resp.status, got[:100])
        except OSError as err:
            last = err
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered as expected (last: {last})")


def run_wrk(
    label: str,
    url: str,
    *,
    headers: Sequence[str] = (),
    threads: int = 2,
    connections: int = 32,
    seconds: int = 10,
    cpus: str | None = None,
) -> WrkResult:
    cmd = [*pinning(cpus), "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for header in headers:
        cmd += ["-H", header]
    out = subprocess.run([*cmd, url], check=True, capture_output=True, text=True).stdout
    return parse_wrk(label, out)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with certificate checks off (the bench gateway's serving cert is self-signed)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, context=ctx, timeout=5) as resp:
        return resp.status, dict(resp.headers), resp.read()


@dataclass
class Gateway:
    url: str
    pid: int


@contextlib.contextmanager
def gateway_process(
    apiservices_dir: Path,
    workdir: Path,
    extra_args: Sequence[str] = (),
    *,
    port: int | None = None,
    cpus: str | None = None,
    anonymous: bool | None = None,
    wrapper: Sequence[str] = (),
    start_timeout: float = 20.0,
) -> Iterator[Gateway]:
    """`aggregator serve` in local mode; anonymous unless the caller configures authentication.
    `wrapper` runs it under another program (valgrind): its pid is then the gateway's."""
    port = port or free_port()
    if anonymous is None:
        anonymous = not any(a.startswith("--client-ca-file") for a in extra_args)
    cmd = [
        *pinning(cpus), *wrapper, sys.executable, "-m", "aggregator", "serve",
        "--apiservices-dir", str(apiservices_dir),
        "--bind-address", "127.0.0.1",
        "--secure-port", str(port),
        "--cert-dir", str(workdir / "certs"),
        *(["--anonymous-auth"] if anonymous else []),
        *extra_args,
    ]  # fmt: skip
    log = (workdir / "gateway.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cwd = None
    if os.environ.get("BENCH_GATEWAY_SRC"):
        # Measure another checkout's gateway (e.g. before a change) with this run's harness
        # (`-m` puts the working directory first on the path, so run from that checkout).
        cwd = env["PYTHONPATH"] = os.environ["BENCH_GATEWAY_SRC"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if fetch(url + "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start; see {workdir / 'gateway.log'}")
            time.sleep(0.1)
        yield Gateway(url, proc.pid)
    finally:
        stop(proc, 10)
        log.close()


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def registration(group: str, version: str, service: str, port: int, ca_pem: bytes) -> list[dict[str, object]]:
    """One APIService with its Service and a ready EndpointSlice on 127.0.0.1:`port` (namespace bench)."""
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"},
            "spec": {
                "group": group,
                "version": version,
                "service": {"namespace": "bench", "name": service, "port": port},
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": "bench", "name": service},
            "spec": {"clusterIP": "127.0.0.1", "ports": [{"name": "https", "port": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": "bench",
                "name": f"{service}-1",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        },
    ]
