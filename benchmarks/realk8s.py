"""Benchmark: the gateway against a real kube-apiserver's aggregator, same backend, same Go client.

Run from the repository root, with a realk8s folder whose processes are up (its README: `./up.sh`):
    .venv/bin/python benchmarks/realk8s.py /work/realk8s [--seconds 10] [--connections 1,4,16]
        [--protocols h1,h2]

kube-apiserver (127.0.0.1:6443) proxies `wardle.example.com` to the real sample-apiserver through
its built-in kube-aggregator. This script starts the gateway in kube mode against that
kube-apiserver (`--kubeconfig pki/admin.kubeconfig`, the front-proxy client certificate from
`pki/`, the cluster's own APIServices and ExternalName Service), so both proxy the same GET to the
same sample-apiserver. The client is the folder's `bin/loadgen` (Go's net/http, the admin client
certificate) in both cases, pointed at one server and then the other, in alternating rounds, over
keep-alive HTTP/1.1 (`h1`) and over HTTP/2 (`h2`: loadgen's `-h2`, what kubectl and client-go
negotiate). Per round it reads the CPU time (utime+stime, /proc/<pid>/stat) the server spent, all
its processes summed (the gateway's control process and its workers), and divides by the requests
answered. It prints req/s, p50, p99 and CPU µs per request for both and the ratios. Targets (issue
33, over HTTP/2): at most 0.8x kube-apiserver's CPU per request, at least 1.0x its req/s, and at
one request at a time a p50 within 0.2 ms of the gateway's own over HTTP/1.1.

`BENCH_GATEWAY_SRC=DIR` runs another checkout's gateway (e.g. `git archive main | tar -x -C DIR`)
with this harness, to compare a change with the tree before it in the same session.

The folder is shared and is only read: the script never starts, stops or changes its processes,
and writes nothing into it. Not for CI: it needs the real binaries.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from wrkbench import free_port, stop

PATH = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders/bench-flunder"


@dataclass(frozen=True)
class Round:
    server: str
    connections: int
    requests: int
    seconds: float
    user: float
    system: float
    p99_ms: float
    p50_ms: float = 0.0
    protocol: str = "h1"

    @property
    def cpu(self) -> float:
        return self.user + self.system

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.requests * 1e6

    def line(self) -> str:
        return (
            f"{self.protocol} c={self.connections} {self.server:<16} {self.rps:>8.0f} req/s  "
            f"p50 {self.p50_ms:>6.2f} ms  p99 {self.p99_ms:>6.2f} ms  "
            f"{self.cpu_us:>6.0f} µs CPU/request ({self.system / self.cpu:.0%} in the kernel; {self.requests} requests)"
        )


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the gateway's workers), from /proc/<pid>/task/*/children."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def tree_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of `pid` and its descendants (/proc/<pid>/stat)."""
    user = system = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for each in process_tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that ended between the listing and the read
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


def loadgen(
    folder: Path, url: str, connections: int, seconds: int, *, http2: bool = False
) -> tuple[int, float, float]:
    """Requests answered 200, the p50 and the p99 in ms; any other answer is an error of the setup."""
    pki = folder / "pki"
    out = subprocess.run(
        [
            str(folder / "bin" / "loadgen"), "-url", url, "-c", str(connections), "-d", f"{seconds}s",
            "-cacert", str(pki / "ca.crt"), "-cert", str(pki / "admin.crt"), "-key", str(pki / "admin.key"),
            *(["-h2"] if http2 else []),
        ],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    values = dict(re.findall(r"(\w+)=([^\s]+)", out))
    codes = dict(pair.split(":", 1) for pair in values.get("codes", "").split(",") if ":" in pair)
    if set(codes) != {"200"} or values.get("errors") != "0":
        raise RuntimeError(f"unexpected loadgen output against {url}:\n{out}")
    return int(codes["200"]), float(values["p50"].removesuffix("ms")), float(values["p99"].removesuffix("ms"))


def measure(
    folder: Path, server: str, base: str, pid: int, connections: int, seconds: int, protocol: str
) -> Round:
    (user, system), started = tree_cpu(pid), time.monotonic()
    requests, p50, p99 = loadgen(folder, base + PATH, connections, seconds, http2=protocol == "h2")
    elapsed, (user_after, system_after) = time.monotonic() - started, tree_cpu(pid)
    return Round(
        server,
        connections,
        requests,
        min(elapsed, float(seconds)),
        user_after - user,
        system_after - system,
        p99,
        p50,
        protocol,
    )


def alive(folder: Path, name: str) -> int:
    pid = int((folder / "run" / f"{name}.pid").read_text())
    os.kill(pid, 0)  # raises if it is not running: then `./up.sh` in the folder, by hand
    return pid


@contextmanager
def gateway(folder: Path, work: Path, workers: int | None) -> Iterator[tuple[str, int]]:
    """The gateway in kube mode against the folder's kube-apiserver, serving with its certificate."""
    pki = folder / "pki"
    port = free_port()
    cmd = [
        sys.executable, "-m", "aggregator", "serve",
        "--kubeconfig", str(pki / "admin.kubeconfig"),
        "--bind-address", "127.0.0.1", "--secure-port", str(port),
        "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
        "--client-ca-file", str(pki / "ca.crt"),
        "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
        "--requestheader-allowed-names", "front-proxy-client",
        "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
        "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
        # The folder's APIServices point at an ExternalName Service on 127.0.0.1 (its README).
        "--allow-external-name-services", "--backend-deny-cidrs", "169.254.0.0/16",
        *(["--workers", str(workers)] if workers else []),
    ]  # fmt: skip
    log = (work / "gateway.log").open("w")
    env, cwd = dict(os.environ), None
    if os.environ.get("BENCH_GATEWAY_SRC"):
        # Another checkout's gateway (e.g. before a change) with this run's harness, as wrkbench does.
        cwd = env["PYTHONPATH"] = os.environ["BENCH_GATEWAY_SRC"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                loadgen(folder, base + PATH, 1, 1)
                break
            except (subprocess.CalledProcessError, RuntimeError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the gateway did not serve {PATH}; see {work / 'gateway.log'}"
                    ) from None
                time.sleep(0.5)
        yield base, proc.pid
    finally:
        stop(proc, 30)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the realk8s folder (its processes up)")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", default="1,4,16", help="loadgen -c values, comma-separated")
    parser.add_argument("--protocols", default="h1,h2", help="h1 and/or h2, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per -c value")
    parser.add_argument("--workers", type=int, help="the gateway's --workers (default: its own default)")
    args = parser.parse_args()
    folder = args.folder.resolve()
    kube_apiserver = alive(folder, "kube-apiserver")
    alive(folder, "sample-apiserver")
    print(f"{os.cpu_count()} CPUs: {cpu_model()}; gateway --workers {args.workers or 'default'}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-realk8s-") as tmp,
        gateway(folder, Path(tmp), args.workers) as (
            base,
            gateway_pid,
        ),
    ):
        servers = [
            ("kube-apiserver", "https://127.0.0.1:6443", kube_apiserver),
            ("gateway", base, gateway_pid),
        ]
        for _, url, _ in servers:  # warm-up: connections, caches (SubjectAccessReview, discovery)
            loadgen(folder, url + PATH, 2, 2)
            loadgen(folder, url + PATH, 2, 2, http2=True)
        protocols = args.protocols.split(",")
        gateway_p50: dict[tuple[str, int], float] = {}
        for connections in (int(c) for c in args.connections.split(",")):
            for protocol in protocols:
                rounds: dict[str, list[Round]] = {name: [] for name, _, _ in servers}
                for _ in range(args.rounds):
                    for name, url, pid in servers:
                        result = measure(folder, name, url, pid, connections, args.seconds, protocol)
                        print(result.line(), flush=True)
                        rounds[name].append(result)
                kas, gw = (summed(rounds[name]) for name, _, _ in servers)
                gateway_p50[protocol, connections] = gw.p50_ms
                print(
                    f"{protocol} c={connections} gateway/kube-apiserver: {gw.cpu_us / kas.cpu_us:.2f}x the CPU "
                    f"per request (target <= 0.8 over h2), {gw.rps / kas.rps:.2f}x the req/s (target >= 1.0 "
                    f"over h2); p50 {gw.p50_ms:.2f} ms vs {kas.p50_ms:.2f} ms, p99 {gw.p99_ms:.2f} ms vs "
                    f"{kas.p99_ms:.2f} ms\n",
                    flush=True,
                )
            if ("h1", connections) in gateway_p50 and ("h2", connections) in gateway_p50:
                gap = gateway_p50["h2", connections] - gateway_p50["h1", connections]
                print(f"c={connections} the gateway's p50 over h2 minus over h1: {gap:+.2f} ms (target <= 0.2 at c=1)\n")
    return 0


def summed(rounds: list[Round]) -> Round:
    """All rounds of one server as one (p99: the worst round's; p50: the rounds' median)."""
    p50s = sorted(r.p50_ms for r in rounds)
    return Round(
        rounds[0].server,
        rounds[0].connections,
        sum(r.requests for r in rounds),
        sum(r.seconds for r in rounds),
        sum(r.user for r in rounds),
        sum(r.system for r in rounds),
        max(r.p99_ms for r in rounds),
        p50s[len(p50s) // 2],
        rounds[0].protocol,
    )


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
