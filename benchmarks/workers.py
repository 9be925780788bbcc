"""Benchmark: `--workers 1, 2, 4` through the proxy, and what one more worker costs in memory.

Run from the repository root:  .venv/bin/python benchmarks/workers.py [--seconds 10] [--counts 1,2,4]

Throughput: the set-up of `proxy.py` (wrk -> nginx front re-sending over TLS with the admin client
certificate -> gateway -> nginx TLS backend demanding the front-proxy certificate), once per
worker count. The gateway's process group (the control process and its workers) gets the first
min(N, CPUs - 1) CPUs and wrk with the nginx processes the rest, with taskset; on a 2-CPU machine
every worker count shares CPU 0, so requests/s cannot scale there and the figure that matters is
CPU per request: the group's CPU time (utime+stime of every process) and the workers' alone,
divided by the requests served. It must not rise with N.

`--unpinned` leaves every process free to use every CPU: on 2 CPUs, 2 workers can then each get a
core while wrk and nginx compete for the same two.

Memory: `scale.py`'s 1000 APIServices (one nginx serving every group's discovery and OpenAPI),
with --workers 2 and --workers 3 once every APIService is Available: the group's PSS (shared
pages split between the processes that map them) at each count; the difference is the memory one
more worker costs. Each worker's USS (pages only it maps) is printed too.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy import DOCUMENT, PATH, backend_conf, front_conf, nginx, prepare
from scale import Client, Scenario, gateway_command, verdict_counts, write_folder
from scale import nginx as scale_nginx
from wrkbench import WrkResult, cpu_seconds, free_port, gateway_process, run_wrk, wait_for_http

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair


def group_pids(supervisor: int) -> tuple[int, list[int]]:
    """The control process and its workers (the supervisor's children)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
    workers = [int(p) for p in children.read_text().split()] if children.exists() else []
    return supervisor, workers


def memory_kib(pid: int) -> tuple[int, int]:
    """(PSS, USS) in KiB from /proc/<pid>/smaps_rollup."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[key] = int(rest.split()[0])
    return values["Pss"], values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)


def split_cpus(workers: int, cpus: int) -> tuple[str | None, str | None]:
    if cpus < 2:
        return None, None
    server = min(workers, cpus - 1)
    return f"0-{server - 1}", f"{server}-{cpus - 1}"


@dataclass(frozen=True)
class Throughput:
    workers: int
    wrk: WrkResult
    group_us: float  # CPU µs per request, every process of the group
    workers_us: float  # CPU µs per request, the workers alone
    server_cpus: str | None

    def line(self) -> str:
        return (
            f"--workers {self.workers}: {self.wrk.requests_per_second:>8.0f} req/s  "
            f"p50 {self.wrk.p50_ms:6.2f} ms  p99 {self.wrk.p99_ms:6.2f} ms  "
            f"CPU {self.group_us:5.0f} µs/request (workers {self.workers_us:5.0f})  "
            f"on CPUs {self.server_cpus or 'any'}"
        )


def throughput(
    workers: int, seconds: int, connections: int, threads: int, *, pinned: bool = True
) -> Throughput:
    cpus = os.cpu_count() or 1
    server_cpus, client_cpus = split_cpus(workers, cpus) if pinned else (None, None)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        ports, pki, folder = prepare(work)
        args = [
            "--client-ca-file", str(pki / "client-ca.crt"),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
            "--workers", str(workers),
        ]  # fmt: skip
        with (
            gateway_process(folder, work, args, port=ports.gateway, cpus=server_cpus) as gateway,
            nginx(work, "backend", backend_conf(work, ports), client_cpus),
            nginx(work, "front", front_conf(work, ports), client_cpus),
        ):
            url = f"http://127.0.0.1:{ports.front_gateway}{PATH}"
            wait_for_http(url, DOCUMENT.encode())
            run_wrk(
                "warm-up",
                url,
                cpus=client_cpus,
                seconds=min(3, seconds),
                connections=connections,
                threads=threads,
            )
            control, worker_pids = group_pids(gateway.pid)
            before = {pid: cpu_seconds(pid) for pid in (control, *worker_pids)}
            result = run_wrk(
                f"--workers {workers}",
                url,
                cpus=client_cpus,
                seconds=seconds,
                connections=connections,
                threads=threads,
            )
            spent = {pid: cpu_seconds(pid) - t for pid, t in before.items()}
    requests = result.requests_per_second * seconds or 1.0
    worker_cpu = sum(spent[p] for p in worker_pids) if worker_pids else spent[control]
    return Throughput(
        workers, result, sum(spent.values()) / requests * 1e6, worker_cpu / requests * 1e6, server_cpus
    )


def group_memory(workers: int, count: int) -> tuple[int, list[int]]:
    """(group PSS KiB, each worker's USS KiB) with `count` APIServices, once all are Available."""
    with tempfile.TemporaryDirectory(prefix=f"bench-workers-mem-{workers}-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # nginx's workers (another user) read the backends' documents
        pki = work / "pki"
        init_pki(pki)
        ca = new_ca("bench-backend-ca")
        write_pair(work, "backend", issue_serving_cert(ca, ["*.bench.svc", "127.0.0.1"]))
        folder = work / "apiservices"
        folder.mkdir()
        backend_port, port = free_port(), free_port()
        scenario = Scenario("healthy", "one", str(workers), count)
        write_folder(folder, scenario, backend_port, base64.b64encode(ca.cert_pem).decode())
        cmd = gateway_command(work, pki, folder, port, str(workers))
        with scale_nginx(work, f"127.0.0.1:{backend_port}", None), (work / "gateway.log").open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            client = Client(f"https://127.0.0.1:{port}", pki)
            try:
                deadline = time.monotonic() + 600
                while True:
                    with contextlib.suppress(OSError, ValueError, KeyError):
                        if verdict_counts(work / "gateway.log")[0] == count:  # every APIService Available
                            break
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"never settled; see {work / 'gateway.log'}")
                    time.sleep(1.0)
                # every worker has served discovery and OpenAPI once (their lazy renderings included)
                for _ in range(workers * 4):
                    client.get("/apis")
                    client.get("/openapi/v2")
                time.sleep(5.0)
                control, worker_pids = group_pids(proc.pid)
                pss = sum(memory_kib(pid)[0] for pid in (control, *worker_pids))
                uss = [memory_kib(pid)[1] for pid in worker_pids]
            finally:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.poll() is None:
                    proc.kill()
    return pss, uss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--counts", default="1,2,4", help="worker counts to measure")
    parser.add_argument("--apiservices", type=int, default=1000, help="for the memory figure (0: skip it)")
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="no taskset: the workers may use every CPU (beside wrk and nginx), so on a small machine "
        "each of 2 workers can get a core of its own",
    )
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    results = [
        throughput(int(n), args.seconds, args.connections, args.threads, pinned=not args.unpinned)
        for n in args.counts.split(",")
        if n
    ]
    print(
        f"\nGET {PATH} ({len(DOCUMENT)} bytes) with the admin client certificate over keep-alive TLS, "
        f"{args.connections} connections, {args.seconds}s each, {cpus} CPUs"
    )
    for result in results:
        print(result.line())
    for result in results[1:]:
        base = results[0]
        print(
            f"--workers {result.workers} vs {base.workers}: "
            f"{result.wrk.requests_per_second / base.wrk.requests_per_second:.2f}x requests/s, "
            f"{result.workers_us / base.workers_us:.2f}x the workers' CPU per request"
        )
    if cpus < 3 and not args.unpinned:
        print(
            f"({cpus} CPUs: every worker count ran on CPU 0 beside wrk's CPU; requests/s cannot scale here)"
        )
    if args.apiservices:
        two, _ = group_memory(2, args.apiservices)
        three, uss_three = group_memory(3, args.apiservices)
        print(
            f"\n{args.apiservices} APIServices, all Available: group PSS {two / 1024:.0f} MiB with 2 workers, "
            f"{three / 1024:.0f} MiB with 3: one more worker costs {(three - two) / 1024:.0f} MiB "
            f"(each worker's own pages, USS: {', '.join(f'{u / 1024:.0f}' for u in uss_three)} MiB)"
        )
    errors = sum(r.wrk.errors for r in results)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
