"""Benchmark: CPU per request over HTTP/2 (h2load) against HTTP/1.1 (wrk), same gateway, same run.

Run from the repository root:  .venv/bin/python benchmarks/http2.py [--seconds 10] [--connections 32]

One gateway process (`--workers 1`, so one process's CPU is the whole cost) in local mode, callers
authenticated with a static bearer token (neither wrk nor h2load presents a client certificate, and
an anonymous caller's HTTP/2 connection is closed after each answer, as kube-apiserver's
UnauthenticatedHTTP2DOSMitigation does). Two paths: `/version` (the gateway's own answer, where the
protocol's share of the cost is largest) and a proxied GET of a 700-byte object from an nginx
backend over TLS. Each path is measured with wrk over keep-alive HTTP/1.1 (`--connections`
connections) and with h2load over HTTP/2 twice: as many connections with one stream each (the same
concurrency), and an eighth of them with 8 streams each (what a client-go process does). Printed:
requests/s, and the CPU microseconds the gateway spent per request (utime+stime from /proc, net of
what it spends over as long a time with no requests), with
the HTTP/2 figures' ratio to HTTP/1.1's. Target (issue 33): at most 1.1x. Last, the multiplexed
`/version` run again beside a client that sends rapid-reset floods (2000 streams opened and reset
at once, a new connection after each GOAWAY): its requests/s against the run alone, and how many
floods were cut. Where the machine has 2 CPUs or more the gateway is pinned to CPU 0, the clients
and the backend to the others.

`--flood-rounds` with `--workers N` (or `--workers default`, the shipped configuration: as many
workers as CPUs) measures the flood comparison with that many serving workers instead; the gateway
is then not pinned (its workers would share one CPU), and its CPU is that of all its processes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from h2.errors import ErrorCodes
from hpack import Encoder
from hyperframe.frame import HeadersFrame, RstStreamFrame, SettingsFrame
from proxy import DOCUMENT, PATH, Ports, backend_conf, nginx
from wrkbench import cpu_seconds, fetch, free_port, gateway_process, pinning, registration, run_wrk

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair
from tests.support.h2client import PREFACE

GROUP, VERSION = "bench.example.com", "v1"
TOKEN = "bench-token-0123456789abcdef"  # a throwaway token for a loopback benchmark
TARGET = 1.1
# The flooding client's address: another machine than h2load's (127.0.0.1), as an attacker is,
# so the gateway's penalty of a flooding address (web/http2/penalty.py) holds the flooder only.
FLOODER = "127.0.0.2"


@dataclass(frozen=True)
class Run:
    label: str
    requests: int
    requests_per_second: float
    errors: int
    cpu_us_per_request: float

    def line(self, baseline: Run | None = None) -> str:
        ratio = (
            f"   {self.cpu_us_per_request / baseline.cpu_us_per_request:.2f}x HTTP/1.1" if baseline else ""
        )
        return (
            f"{self.label:<40} {self.requests_per_second:>8.0f} req/s   errors {self.errors:<4} "
            f"CPU {self.cpu_us_per_request:>6.0f} µs/request{ratio}"
        )


def h2load(
    url: str, *, connections: int, streams: int, seconds: int, cpus: str | None
) -> tuple[int, float, int]:
    """h2load over HTTP/2 for `seconds`: requests done, requests/s, failed ones."""
    cmd = [
        *pinning(cpus), "h2load", "-c", str(connections), "-m", str(streams), "-D", str(seconds),
        "-t", "1", "-H", f"Authorization: Bearer {TOKEN}", url,
    ]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    done = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out
    )
    rate = re.search(r"finished in [0-9.]+\w+, ([0-9.]+) req/s", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    if not (done and rate and codes):
        raise RuntimeError(f"could not read h2load output:\n{out}")
    if "h2" not in out:
        raise RuntimeError(f"h2load did not negotiate h2:\n{out}")
    failed = int(done.group(3)) + int(done.group(4)) + max(0, int(done.group(2)) - int(codes.group(1)))
    return int(done.group(1)), float(rate.group(1)), failed


def over_h2(label: str, url: str, pid: int, cpus: str | None, *, idle: float = 0.0, **opts: int) -> Run:
    before, started = cpu_seconds(pid), time.monotonic()
    requests, rate, failed = h2load(url, cpus=cpus, **opts)
    spent = cpu_seconds(pid) - before - idle * (time.monotonic() - started)
    return Run(label, requests, rate, failed, spent / max(requests, 1) * 1e6)


def idle_rate(pid: int, seconds: float) -> float:
    """CPU seconds per second the gateway spends with no request (timers, availability checks):
    subtracted from each run, so a client that gets fewer requests through is not charged more
    background work per request."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def over_h1(
    label: str, url: str, pid: int, cpus: str | None, *, connections: int, seconds: int, idle: float = 0.0
) -> Run:
    before, started = cpu_seconds(pid), time.monotonic()
    result = run_wrk(
        label,
        url,
        headers=[f"Authorization: Bearer {TOKEN}"],
        threads=1,
        connections=connections,
        seconds=seconds,
        cpus=cpus,
    )
    spent = cpu_seconds(pid) - before - idle * (time.monotonic() - started)
    requests = int(result.requests_per_second * seconds)
    return Run(label, requests, result.requests_per_second, result.errors, spent / max(requests, 1) * 1e6)


class Flood(threading.Thread):
    """Rapid-reset floods (CVE-2023-44487) of 2000 streams each, one connection after another (from
    `FLOODER`), until stopped; counts the floods the gateway cut with GOAWAY ENHANCE_YOUR_CALM.

    Blocking sockets, the flood's bytes built once: the client spends its CPU on TLS and on
    sending, not on an event loop or an HTTP/2 library, so what the floods cost the measured client
    is what they cost the gateway, not what the flooding client takes from the CPUs they share."""

    def __init__(self, port: int, cpus: set[int] | None) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.cpus = cpus  # off the gateway's CPU: the flood's own cost is not the gateway's
        self.stopping = threading.Event()
        self.floods = 0
        self.cut = 0
        self.cpu_seconds = 0.0  # what flooding cost this client (its thread's CPU time)

    def run(self) -> None:
        started = time.thread_time()
        try:
            self._flood()
        finally:
            self.cpu_seconds = time.thread_time() - started

    def _flood(self) -> None:
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # this thread only
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        flood = flood_bytes()
        while not self.stopping.is_set():
            with (
                socket.create_connection(("127.0.0.1", self.port), source_address=(FLOODER, 0)) as raw,
                context.wrap_socket(raw) as connection,
            ):
                with contextlib.suppress(OSError):  # cut before it was all sent: the answer says how
                    connection.sendall(flood)
                self.floods += 1
                if goaway_code(connection) == ErrorCodes.ENHANCE_YOUR_CALM:
                    self.cut += 1


def flood_bytes() -> bytes:
    """The preface, SETTINGS, and 2000 requests each followed by its RST_STREAM. Encoded in order
    on a fresh HPACK table, as every new connection has one: the same bytes are a valid flood on
    each connection."""
    encoder = Encoder()
    frames = [PREFACE, SettingsFrame(0).serialize()]
    for n in range(2000):
        sid = 2 * n + 1
        fields = [(":method", "GET"), (":path", "/version"), (":scheme", "https"), (":authority", "gateway")]
        block = encoder.encode([*fields, ("authorization", f"Bearer {TOKEN}")])
        frames.append(HeadersFrame(sid, block, flags=["END_HEADERS", "END_STREAM"]).serialize())
        frames.append(RstStreamFrame(sid, error_code=ErrorCodes.CANCEL).serialize())
    return b"".join(frames)


def goaway_code(connection: ssl.SSLSocket, timeout: float = 60.0) -> int | None:
    """The error code of the GOAWAY the server sends (None if it closes without one)."""
    connection.settimeout(timeout)
    buffer = b""
    while True:
        try:
            data = connection.recv(65536)
        except OSError:
            return None
        if not data:
            return None
        buffer += data
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            if buffer[3] == 0x7:  # GOAWAY: last stream id, then the error code
                return int.from_bytes(buffer[13:17], "big")
            buffer = buffer[9 + length :]


def proxied_ready(url: str, timeout: float = 20.0) -> None:
    """Until the proxied path answers the backend's document (nginx and the gateway start apart)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, _, body = fetch(url, {"Authorization": f"Bearer {TOKEN}"})
            if status == 200 and body == DOCUMENT.encode():
                return
            last = status
        except OSError as err:  # urllib's HTTPError for a 503 too
            last = err
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered the backend's document (last: {last})")


def flood_rounds(
    workers: int | None,
    url: str,
    pid: int,
    port: int,
    rounds: int,
    seconds: int,
    connections: int,
    server_cpu: str | None,
    client_cpus: str | None,
    cpus: int,
) -> int:
    """The multiplexed `/version` run alone, then beside back-to-back floods, `rounds` times: the
    two alternate, so a change in the machine's load moves both sides of each ratio."""
    over_h2("warm-up", url, pid, client_cpus, connections=connections, streams=8, seconds=min(3, seconds))
    ratios: list[float] = []
    shares: list[float] = []
    for round_ in range(rounds):
        alone = over_h2("alone", url, pid, client_cpus, connections=connections, streams=8, seconds=seconds)
        flood = Flood(port, set(range(1, cpus)) if server_cpu else None)
        before = cpu_seconds(pid)
        flood.start()
        beside = over_h2("beside floods", url, pid, client_cpus, connections=connections, streams=8, seconds=seconds)
        flood.stopping.set()
        flood.join(90)
        # The gateway's CPU over the run beside floods, less what its requests cost alone: the floods'.
        total = cpu_seconds(pid) - before
        floods = max(0.0, total - alone.cpu_us_per_request * beside.requests / 1e6)
        ratio = beside.requests_per_second / alone.requests_per_second
        ratios.append(ratio)
        shares.append(floods / total if total else 0.0)
        print(
            f"round {round_ + 1}: alone {alone.requests_per_second:.0f} req/s, beside floods "
            f"{beside.requests_per_second:.0f} req/s ({ratio:.2f}x, errors {alone.errors + beside.errors}); "
            f"{flood.cut} of {flood.floods} floods cut, about {floods / max(flood.floods, 1) * 1e3:.1f} ms of "
            f"gateway CPU each, {shares[-1]:.0%} of its CPU in that run; the flooding client used "
            f"{flood.cpu_seconds / seconds:.0%} of a CPU; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    ordered = sorted(ratios)
    print(
        f"\n/version beside rapid-reset floods, --workers {workers or 'default'}, {connections} conns x 8 "
        f"streams, {seconds}s per run: "
        f"{', '.join(f'{r:.2f}x' for r in ratios)} the run alone (median {ordered[len(ordered) // 2]:.2f}x, "
        f"target >= 0.8x); the floods' share of the gateway's CPU: median {sorted(shares)[len(shares) // 2]:.0%}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--flood-rounds",
        type=int,
        default=0,
        help="only the flood comparison: this many alternating rounds of the multiplexed /version run "
        "alone and beside floods (the CPU comparisons are skipped)",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="with --flood-rounds: the gateway's --workers (a number, or 'default' for the shipped "
        "default, one per CPU); the CPU comparisons always run one worker",
    )
    args = parser.parse_args()
    if not args.flood_rounds and args.workers != "1":
        parser.error("--workers applies to --flood-rounds only")
    workers = None if args.workers == "default" else int(args.workers)
    for tool in ("wrk", "h2load"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (wrk; h2load is in Debian's nghttp2-client)")
            return 2
    cpus = os.cpu_count() or 1
    pinned = cpus >= 2 and workers == 1
    server_cpu, client_cpus = ("0", f"1-{cpus - 1}") if pinned else (None, None)
    connections, seconds = args.connections, args.seconds
    multiplexed = max(1, connections // 8)

    with tempfile.TemporaryDirectory(prefix="bench-http2-") as tmp:
        work = Path(tmp)
        init_pki(work / "pki")
        backend_ca = new_ca("bench-backend-ca")
        write_pair(work, "backend", issue_serving_cert(backend_ca, ["backend.bench.svc", "127.0.0.1"]))
        ports = Ports(*(free_port() for _ in range(6)))
        folder = work / "apiservices"
        folder.mkdir()
        manifests = registration(GROUP, VERSION, "backend", ports.backend, backend_ca.cert_pem)
        (folder / "bench.yaml").write_text(yaml.safe_dump_all(manifests))
        tokens = work / "tokens.csv"
        tokens.write_text(f'{TOKEN},bench,bench-uid,"system:authenticated"\n')
        pki = work / "pki"
        gateway_args = [
            *(["--workers", str(workers)] if workers is not None else []),
            "--token-auth-file", str(tokens),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
        ]  # fmt: skip
        results: list[tuple[str, list[Run]]] = []
        with (
            gateway_process(folder, work, gateway_args, port=ports.gateway, cpus=server_cpu) as gw,
            nginx(work, "backend", backend_conf(work, ports), client_cpus),
        ):
            proxied_ready(gw.url + PATH)
            if args.flood_rounds:
                return flood_rounds(workers, gw.url + "/version", gw.pid, ports.gateway, args.flood_rounds, seconds, multiplexed, server_cpu, client_cpus, cpus)  # fmt: skip
            for name, path in (("/version", "/version"), ("proxied GET", PATH)):
                url = gw.url + path
                warm = min(3, seconds)
                over_h1("warm-up", url, gw.pid, client_cpus, connections=connections, seconds=warm)
                over_h2("warm-up", url, gw.pid, client_cpus, connections=connections, streams=1, seconds=warm)
                idle = idle_rate(gw.pid, seconds)
                runs = [
                    over_h1(f"HTTP/1.1 wrk, {connections} conns", url, gw.pid, client_cpus, connections=connections, seconds=seconds, idle=idle),
                    over_h2(f"HTTP/2 h2load, {connections} conns x 1 stream", url, gw.pid, client_cpus, connections=connections, streams=1, seconds=seconds, idle=idle),
                    over_h2(f"HTTP/2 h2load, {multiplexed} conns x 8 streams", url, gw.pid, client_cpus, connections=multiplexed, streams=8, seconds=seconds, idle=idle),
                ]  # fmt: skip
                results.append((name, runs))
            flood = Flood(ports.gateway, set(range(1, cpus)) if server_cpu else None)
            flood.start()
            url = gw.url + "/version"
            beside = over_h2(f"HTTP/2 h2load, {multiplexed} conns x 8 streams", url, gw.pid, client_cpus, connections=multiplexed, streams=8, seconds=seconds)  # fmt: skip
            flood.stopping.set()
            flood.join(90)
    print(
        f"\nOne gateway process (--workers 1), bearer-token callers, {seconds}s per run, {cpus} CPUs"
        + (f" (gateway on CPU {server_cpu}, clients and backend on {client_cpus})" if server_cpu else "")
    )
    worst = 0.0
    errors = 0
    for name, runs in results:
        print(f"\n{name}")
        h1 = runs[0]
        print(h1.line())
        for run in runs[1:]:
            print(run.line(h1))
            worst = max(worst, run.cpu_us_per_request / h1.cpu_us_per_request)
        errors += sum(run.errors for run in runs)
    alone = results[0][1][2]
    print(
        f"\n/version beside rapid-reset floods: {beside.requests_per_second:.0f} req/s, "
        f"{beside.requests_per_second / alone.requests_per_second:.2f}x the run alone; "
        f"{flood.cut} of {flood.floods} floods of 2000 streams cut with GOAWAY ENHANCE_YOUR_CALM"
    )
    errors += beside.errors
    print(f"\nworst HTTP/2 CPU per request: {worst:.2f}x HTTP/1.1's (target <= {TARGET}x); errors {errors}")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
