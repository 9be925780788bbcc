"""Benchmark: instructions per request over HTTP/2 against HTTP/1.1, counted by callgrind.

Run from the repository root:  .venv/bin/python benchmarks/http2_instructions.py [--seconds 20]

`benchmarks/http2.py` measures CPU time, which on a shared machine moves with everything else
running there (the same run gave 1.06x and 1.38x minutes apart at a load average of 17). This
script runs one gateway process (`--workers 1`, bearer-token callers, local mode) under valgrind's
callgrind and counts the instructions it executes while one client sends requests one at a time
over one connection: wrk over keep-alive HTTP/1.1, then h2load over HTTP/2 (one stream at a time),
then h2load with 8 streams at once. Each count is net of the background work the process does over
as long a time with no requests, and divided by the requests: figures that do not depend on the
machine's load. Paths: `/version` (the gateway's own answer, where the protocol's share is
largest) and a GET proxied to an nginx backend. Printed: instructions per request and the HTTP/2
figures' ratio to HTTP/1.1's. Target (issue 33): at most 1.1x.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from http2 import TOKEN, proxied_ready
from proxy import PATH, backend_conf, nginx, prepare
from proxy_instructions import _callgrind, _totals
from wrkbench import gateway_process

TARGET = 1.1


@dataclass(frozen=True)
class Count:
    label: str
    per_request: float  # instructions, net of the background work
    requests: int

    def line(self, base: Count | None = None) -> str:
        ratio = f"   {self.per_request / base.per_request:.2f}x HTTP/1.1" if base is not None else ""
        return f"{self.label:<32} {self.per_request / 1000:>7.0f}k instructions/request ({self.requests} requests){ratio}"


def wrk(url: str, seconds: int) -> int:
    out = subprocess.run(
        ["wrk", "-t1", "-c1", f"-d{seconds}s", "--timeout", "60s", "-H", f"Authorization: Bearer {TOKEN}", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"(\d+) requests in", out)
    if match is None or "Non-2xx" in out:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return int(match.group(1))


def h2load(url: str, seconds: int, streams: int) -> int:
    out = subprocess.run(
        [
            "h2load", "-c1", f"-m{streams}", f"-D{seconds}", "-H", f"authorization: Bearer {TOKEN}", url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if match is None or match.group(1) != match.group(2) or "status codes: 0 2xx" in out:
        raise RuntimeError(f"unexpected h2load output:\n{out}")
    return int(match.group(2))


def counted(pid: int, out: Path, label: str, seconds: int, send: Callable[[], int], dumps: list[int]) -> Count:
    """Instructions while `send` runs, net of as long a time with no requests."""
    _callgrind(pid, "-i", "on")
    requests = send()
    _callgrind(pid, "-i", "off")
    _callgrind(pid, "-d")
    _callgrind(pid, "-i", "on")
    time.sleep(seconds)
    _callgrind(pid, "-i", "off")
    _callgrind(pid, "-d")
    busy_dump, idle_dump = dumps[0] + 1, dumps[0] + 2
    dumps[0] += 2
    busy, idle = _totals(Path(f"{out}.{busy_dump}")), _totals(Path(f"{out}.{idle_dump}"))
    return Count(label, (busy - idle) / requests, requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    seconds = args.seconds
    results: list[tuple[str, list[Count]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-h2-instructions-") as tmp:
        work = Path(tmp)
        ports, pki, folder = prepare(work)
        tokens = work / "tokens.csv"
        tokens.write_text(f'{TOKEN},bench,bench-uid,"system:authenticated"\n')
        gateway_args = [
            "--workers", "1",
            "--token-auth-file", str(tokens),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
        ]  # fmt: skip
        out = work / "callgrind.out"
        wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        dumps = [0]
        with (
            nginx(work, "backend", backend_conf(work, ports), None),
            gateway_process(folder, work, gateway_args, port=ports.gateway, wrapper=wrapper, start_timeout=300) as gw,
        ):
            proxied_ready(gw.url + PATH, timeout=120)
            for name, path in (("/version", "/version"), ("proxied GET", PATH)):
                url = gw.url + path
                wrk(url, 3)  # warm-up
                h2load(url, 3, 1)
                clients: list[tuple[str, Callable[[], int]]] = [
                    ("HTTP/1.1 wrk, 1 connection", partial(wrk, url, seconds)),
                    ("HTTP/2 h2load, 1 stream", partial(h2load, url, seconds, 1)),
                    ("HTTP/2 h2load, 8 streams", partial(h2load, url, seconds, 8)),
                ]
                runs = [counted(gw.pid, out, label, seconds, send, dumps) for label, send in clients]
                results.append((name, runs))
                for run in runs:
                    print(f"{name}: {run.line(runs[0] if run is not runs[0] else None)}", flush=True)
    print(f"\nOne gateway process under callgrind, bearer-token callers, one connection, {seconds}s per run")
    worst = 0.0
    for name, runs in results:
        print(f"\n{name}")
        h1 = runs[0]
        print(h1.line())
        for run in runs[1:]:
            print(run.line(h1))
            worst = max(worst, run.per_request / h1.per_request)
    print(f"\nworst HTTP/2 instructions per request: {worst:.2f}x HTTP/1.1's (target <= {TARGET}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
