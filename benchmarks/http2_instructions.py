"""Benchmark: instructions per request over HTTP/2 against HTTP/1.1, counted by callgrind.

Run from the repository root:
    .venv/bin/python benchmarks/http2_instructions.py [--requests 400] [--rounds 3] [--path version|proxied]

`benchmarks/http2.py` measures CPU time, which on a shared machine moves with everything else
running there (the same run gave 1.06x and 1.38x minutes apart at a load average of 17). This
script runs one gateway process (`--workers 1`, bearer-token callers, local mode) under valgrind's
callgrind and counts the instructions it executes while one client sends a fixed number of
requests over one connection: h2load over HTTP/1.1 (`--h1`, keep-alive, one request at a time),
over HTTP/2 one stream at a time, and over HTTP/2 with 8 streams at once. The same client for
both protocols, the same number of requests: the counts differ only by what the gateway does.
Each count is net of the background work the process does over as long a time with no requests
(measured right after it), and divided by the requests. The three clients alternate for
`--rounds` rounds and the median of each is printed, so one round's background burst (an
availability check, a render) does not decide the ratio. Paths: `/version` (the gateway's own
answer, where the protocol's share is largest) and a GET proxied to an nginx backend (warmed up
with 8 streams first, so every run finds its backend connections open). Printed: instructions per
request and the HTTP/2 figures' ratio to HTTP/1.1's. Target (issue 33): at most 1.1x. Every
count includes the client's one TLS handshake, spread over `--requests`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
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

from callgrind import inclusive
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
    # The same without the cyclic garbage collector's collections (`--net-gc`): a collection of the
    # old generation costs about 11M instructions and lands in one run or another, so single
    # rounds of the same tree differ by about 40k a request; this figure does not move with it.
    without_gc: float | None = None

    def line(self, base: Count | None = None) -> str:
        ratio = f"   {self.per_request / base.per_request:.2f}x HTTP/1.1" if base is not None else ""
        gc = ""
        if self.without_gc is not None:
            gc = f"; {self.without_gc / 1000:.0f}k net of GC collections"
            if base is not None and base.without_gc:
                gc += f", {self.without_gc / base.without_gc:.2f}x"
        return (
            f"{self.label:<32} {self.per_request / 1000:>7.0f}k instructions/request ({self.requests} requests)"
            f"{ratio}{gc}"
        )


def h2load(url: str, requests: int, streams: int, *, http1: bool = False) -> int:
    """`requests` requests over one connection (HTTP/1.1 one at a time with `http1`); how many
    succeeded (every one must)."""
    protocol = ["--h1"] if http1 else []
    cmd = [
        "h2load",
        "-c1",
        f"-m{streams}",
        f"-n{requests}",
        *protocol,
        "-H",
        f"authorization: Bearer {TOKEN}",
        url,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    match = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    if (
        match is None
        or codes is None
        or not (int(match.group(1)) == int(match.group(2)) == int(codes.group(1)) == requests)
    ):
        raise RuntimeError(f"unexpected h2load output:\n{out}")
    protocol_line = f"Application protocol: {'http/1.1' if http1 else 'h2'}\n"
    if protocol_line not in out:
        raise RuntimeError(f"h2load did not negotiate {protocol_line}:\n{out}")
    return requests


def counted(
    pid: int,
    out: Path,
    label: str,
    send: Callable[[], int],
    dumps: list[int],
    warm: Callable[[], object] | None,
    keep: Path | None = None,
    net_gc: bool = False,
) -> Count:
    """Instructions while `send` runs, net of as long a time with no requests. `warm` runs first,
    uncounted: 8 streams at once need 8 backend connections, and the gateway closes spare idle
    ones after 5 s (`backends/h1.SPARE_KEEPALIVE`), which the idle measurement before outlasts; a
    client that keeps 8 requests in flight keeps them open, so the count should not re-dial them."""
    if warm is not None:
        warm()
    _callgrind(pid, "-i", "on")
    started = time.monotonic()
    requests = send()
    seconds = time.monotonic() - started
    _callgrind(pid, "-i", "off")
    _callgrind(pid, "-d")
    _callgrind(pid, "-i", "on")
    time.sleep(seconds)
    _callgrind(pid, "-i", "off")
    _callgrind(pid, "-d")
    busy_dump, idle_dump = dumps[0] + 1, dumps[0] + 2
    dumps[0] += 2
    busy, idle = _totals(Path(f"{out}.{busy_dump}")), _totals(Path(f"{out}.{idle_dump}"))
    without_gc = None
    if net_gc:
        busy_gc, idle_gc = _collections(Path(f"{out}.{busy_dump}")), _collections(Path(f"{out}.{idle_dump}"))
        without_gc = ((busy - busy_gc) - (idle - idle_gc)) / requests
    if keep is not None:  # for callgrind_annotate: the busy dump and the idle one after it
        name = re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-")
        shutil.copy(f"{out}.{busy_dump}", keep / f"{busy_dump:03d}-{name}.busy")
        shutil.copy(f"{out}.{idle_dump}", keep / f"{busy_dump:03d}-{name}.idle")
    return Count(label, (busy - idle) / requests, requests, without_gc)


def _collections(dump: Path) -> int:
    """The instructions of the cyclic garbage collector's collections in a dump (inclusive)."""
    return inclusive(dump, ("gc_collect_main",))["gc_collect_main"]


def median(counts: list[Count]) -> Count:
    ordered = sorted(counts, key=lambda count: count.per_request)
    middle = ordered[len(ordered) // 2]
    without = sorted(count.without_gc for count in counts if count.without_gc is not None)
    without_gc = without[len(without) // 2] if without else None
    return Count(middle.label, middle.per_request, sum(count.requests for count in counts), without_gc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is printed")
    parser.add_argument("--path", choices=["version", "proxied", "both"], default="both")
    parser.add_argument("--keep", type=Path, help="a folder to keep callgrind's dumps in (callgrind_annotate)")
    parser.add_argument(
        "--net-gc",
        action="store_true",
        help="also print each figure without the garbage collector's collections (callgrind_annotate on each dump)",
    )
    parser.add_argument(
        "--baseline-src",
        help="another checkout (e.g. before a change) whose gateway is measured too, in alternating rounds",
    )
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    trees: list[tuple[str, str | None]] = [("", None)]
    if args.baseline_src:
        trees = [("baseline ", args.baseline_src), ("", None)]
    results: list[tuple[str, list[Count]]] = []
    for tree, src in trees:
        if src is None:
            os.environ.pop("BENCH_GATEWAY_SRC", None)
        else:
            os.environ["BENCH_GATEWAY_SRC"] = src
        results += measure(args, tree)
    report(results, args.requests, args.rounds)
    return 0


def measure(args: argparse.Namespace, tree: str) -> list[tuple[str, list[Count]]]:
    """Every path's three clients, alternating over `args.rounds`, against one gateway process."""
    requests = args.requests
    paths = [("/version", "/version"), ("proxied GET", PATH)]
    if args.path != "both":
        paths = [paths[0] if args.path == "version" else paths[1]]
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
            gateway_process(
                folder, work, gateway_args, port=ports.gateway, wrapper=wrapper, start_timeout=300
            ) as gw,
        ):
            proxied_ready(gw.url + PATH, timeout=120)
            for name, path in paths:
                url = gw.url + path
                clients: list[tuple[str, Callable[[], int], Callable[[], object] | None]] = [
                    ("HTTP/1.1 h2load --h1", partial(h2load, url, requests, 1, http1=True), None),
                    ("HTTP/2 h2load, 1 stream", partial(h2load, url, requests, 1), None),
                    ("HTTP/2 h2load, 8 streams", partial(h2load, url, requests, 8), partial(h2load, url, 16, 8)),
                ]
                h2load(url, 100, 8)  # warm-up; the 8 backend connections it opens stay open
                h2load(url, 100, 1)
                h2load(url, 100, 1, http1=True)
                rounds: list[list[Count]] = [[] for _ in clients]
                for round_ in range(args.rounds):
                    for index, (label, send, warm) in enumerate(clients):
                        run = counted(gw.pid, out, f"{tree}{name} {label}", send, dumps, warm, args.keep, args.net_gc)
                        run = Count(label, run.per_request, run.requests, run.without_gc)
                        rounds[index].append(run)
                        base = rounds[0][-1]
                        print(f"{tree}{name} round {round_ + 1}: {run.line(base if index else None)}", flush=True)
                results.append((f"{tree}{name}", [median(runs) for runs in rounds]))
    return results


def report(results: list[tuple[str, list[Count]]], requests: int, rounds: int) -> None:
    print(
        f"\nOne gateway process under callgrind, bearer-token callers, one connection, {requests} requests per run,"
    )
    print(f"median of {rounds} alternating rounds")
    worst = 0.0
    for name, runs in results:
        print(f"\n{name}")
        h1 = runs[0]
        print(h1.line())
        for run in runs[1:]:
            print(run.line(h1))
            if not name.startswith("baseline "):
                worst = max(worst, run.per_request / h1.per_request)
    print(f"\nworst HTTP/2 instructions per request: {worst:.2f}x HTTP/1.1's (target <= {TARGET}x)")


if __name__ == "__main__":
    sys.exit(main())
