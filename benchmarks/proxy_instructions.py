"""Benchmark: instructions per proxied request, counted by callgrind, against a baseline checkout.

Run from the repository root:
    .venv/bin/python benchmarks/proxy_instructions.py [--baseline-src DIR] [--seconds 20]

`benchmarks/proxy.py` measures CPU time, which on a shared machine moves with everything else
running there. This script runs the same request (proxy.py's GET, client certificate, front-proxy
CA configured, every per-request feature on by default) through the gateway under valgrind's
callgrind, counts the instructions the gateway's process executes while wrk sends requests over
one keep-alive connection, and divides by the requests: a figure that does not depend on the
machine's load. With `--baseline-src` (another checkout, e.g. `git archive main | tar -x -C DIR`)
the same run measures that tree too and prints the ratio; `--baseline-us` turns the ratio into
CPU time on a machine where `proxy.py` measured the baseline. The reference: commit bf40649 (the
request path before issue 25) took 155 µs per request there (`git archive bf40649`).
Per request means net of the background work (timers, availability checks) the same process
does over as long a time with no requests. `--tracing-rate N` also measures this tree with
`--tracing-config-file` at `samplingRatePerMillion: N` in every round (0: configured, nothing
sampled; the requests carry no `traceparent`), so the cost of tracing that samples nothing is
read against the same tree without it, and against the baseline. `--compare-apf` also measures
this tree with `--enable-priority-and-fairness=false` (max-in-flight), and sends every request as a
user who is not in system:masters (whose requests APF would exempt), so the fast path measured is a
queued priority level's, `global-default` (`apf_instructions.py` counts APF's own part exactly). valgrind makes everything about 50x slower, so a few
dozen requests per second are counted; wrk's latencies mean nothing here. Counting starts once the
gateway's start-up work has settled (`wait_settled`, read from its /metrics): the backend's OpenAPI
documents downloaded and merged, which under valgrind lands seconds after the first request. The
cyclic collector's runs and TLS handshakes are left out of both windows (`ONE_OFF`): one of either
lands in a window or not, and moved a round by more than what is compared.
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callgrind import inclusive
from prometheus_client.parser import text_string_to_metric_families
from proxy import DOCUMENT, GROUP, PATH, VERSION, Ports, backend_conf, front_conf, nginx, prepare
from wrkbench import gateway_process, run_wrk, wait_for_http

from aggregator.tls.issue import issue_client_cert, load_pair, write_pair

APF_OFF = "--enable-priority-and-fairness=false"
BENCH_USER = "bench-user"


@dataclass(frozen=True)
class Counted:
    label: str
    instructions: int  # while wrk sent requests, `ONE_OFF`'s runs left out
    idle: int  # the same process over as long a time with no requests (timers, background work), the same
    requests: int
    left_out: int  # `ONE_OFF`'s runs while wrk sent requests

    @property
    def per_request(self) -> float:
        """Net of the background work: what the requests themselves cost."""
        return (self.instructions - self.idle) / self.requests

    def line(self) -> str:
        return (
            f"{self.label:<12} {self.per_request / 1000:>6.0f}k instructions/request net of "
            f"{self.idle / self.requests / 1000:.0f}k of background work per request "
            f"({self.requests} requests; collections and handshakes left out: {self.left_out / 1e6:.1f}M)"
        )


def _wrk_requests(url: str, seconds: int) -> int:
    # One connection: each request then wakes the process the same way however fast valgrind lets
    # it run. With more, a process slowed down by other work on the machine finds several events
    # per wake-up, and its instructions per request fall as the machine gets busier.
    out = subprocess.run(
        ["wrk", "-t1", "-c1", f"-d{seconds}s", url], check=True, capture_output=True, text=True
    ).stdout
    match = re.search(r"(\d+) requests in", out)
    if match is None or "Non-2xx" in out:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return int(match.group(1))


APISERVICE = f"{VERSION}.{GROUP}"
# The gateway waits up to 9x a v2 merge's duration before the next (`openapi/component.py`'s
# MERGE_SPACING): no merge for longer than 10x the last one's (and a few seconds) means none is due.
MERGE_SPACING = 10.0


@dataclass(frozen=True)
class StartUp:
    """What the gateway's start-up work has done, from its /metrics."""

    fetched: frozenset[str]  # the bench APIService's OpenAPI documents downloaded (v2, v3)
    merges: float  # v2 merges so far
    merge_seconds: float  # how long the last one took


def start_up(url: str, pki: Path) -> StartUp:
    """Scrape /metrics as the admin (system:masters, the client certificate `prepare` issued)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    with urllib.request.urlopen(url + "/metrics", context=ctx, timeout=60) as resp:
        text = resp.read().decode()
    fetched: set[str] = set()
    merges = seconds = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "aggregator_openapi_fetches_total" and sample.value > 0:
                if sample.labels["apiservice"] == APISERVICE and sample.labels["result"] == "ok":
                    fetched.add(sample.labels["document"])
            elif sample.name == "aggregator_openapi_v2_merges_total":
                merges = sample.value
            elif sample.name == "aggregator_openapi_v2_merge_duration_seconds":
                seconds = sample.value
    return StartUp(frozenset(fetched), merges, seconds)


def settled(state: StartUp, unchanged_for: float, quiet: float) -> bool:
    """Both documents in and merged, and no merge for longer than the next one could be due."""
    in_and_merged = {"v2", "v3"} <= state.fetched and state.merges > 0
    return in_and_merged and unchanged_for > max(quiet, MERGE_SPACING * state.merge_seconds)


def wait_settled(url: str, pid: int, pki: Path, timeout: float = 300, quiet: float = 3.0) -> StartUp:
    """Until the gateway's one-off start-up work is behind it, so that none of it lands in a counted
    window: the bench APIService's OpenAPI v2 and v3 downloaded (after its first availability check,
    slow under valgrind) and no v2 merge (the merge and its JSON, protobuf and gzip renderings:
    millions of instructions) for longer than the gateway would wait before the next one, and then
    the process asleep (`asleep`)."""
    deadline = time.monotonic() + timeout
    last = start_up(url, pki)
    since = time.monotonic()
    while True:
        time.sleep(0.5)
        now = start_up(url, pki)
        if now != last:
            last, since = now, time.monotonic()
        elif settled(now, time.monotonic() - since, quiet) and asleep(pid, quiet):
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway's start-up work did not settle: {now}")


def asleep(pid: int, seconds: float, share: float = 0.9) -> bool:
    """Whether the process's main thread was asleep (its event loop waiting, state S) in at least
    `share` of 20 looks a second over `seconds`: whatever else it still does once started (a lazy
    import such as `watchfiles`', a folder watcher's first look) is over. Its state, not its CPU
    time: on a loaded machine a busy process gets little CPU time but stays runnable (R)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat")
    looks = max(1, round(seconds * 20))
    sleeping = 0
    for _ in range(looks):
        # (the state follows the command name, which is in parentheses and may hold spaces)
        sleeping += stat.read_text().rsplit(")", 1)[1].split()[0] == "S"
        time.sleep(0.05)
    return sleeping >= share * looks


def _callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def count(
    label: str,
    work: Path,
    ports: Ports,
    pki: Path,
    folder: Path,
    gateway_args: list[str],
    src: str | None,
    seconds: int,
    keep: Path | None = None,
) -> Counted:
    out = work / f"callgrind.{label.replace(' ', '-')}.out"
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if src:
        os.environ["BENCH_GATEWAY_SRC"] = src
    else:
        os.environ.pop("BENCH_GATEWAY_SRC", None)
    with gateway_process(
        folder, work, gateway_args, port=ports.gateway, wrapper=wrapper, start_timeout=300
    ) as gateway:
        url = f"http://127.0.0.1:{ports.front_gateway}{PATH}"
        wait_for_http(url, DOCUMENT.encode(), timeout=120)
        wait_settled(gateway.url, gateway.pid, pki)
        run_wrk("warm-up", url, threads=1, connections=2, seconds=5)
        _callgrind(gateway.pid, "-i", "on")
        requests = _wrk_requests(url, seconds)
        _callgrind(gateway.pid, "-i", "off")
        _callgrind(gateway.pid, "-d")  # dump 1: the requests
        _callgrind(gateway.pid, "-i", "on")
        time.sleep(seconds)
        _callgrind(gateway.pid, "-i", "off")
        _callgrind(gateway.pid, "-d")  # dump 2: as long with no requests
    # One file per `callgrind_control -d` (`<out>.1`, `<out>.2`) plus one at exit (about empty:
    # instrumentation is off by then); each ends with `totals:` (its `summary:` line may read 0).
    busy, idle = (_totals(Path(f"{out}.{n}")) for n in (1, 2))
    left_out, idle_left_out = (_one_off(Path(f"{out}.{n}")) for n in (1, 2))
    for dump in work.glob(f"{out.name}*"):
        if keep is not None:
            dump.rename(keep / dump.name)
        else:
            dump.unlink()
    return Counted(label, busy - left_out, idle - idle_left_out, requests, left_out)


def tracing_args(work: Path, rate: int) -> list[str]:
    """`--tracing-config-file` for a configuration at `rate` per million. Its endpoint is a port
    nothing listens on: at rate 0 no span is made, and any export would only fail."""
    config = work / f"tracing-{rate}.yaml"
    config.write_text(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n"
        f"endpoint: 127.0.0.1:9\nsamplingRatePerMillion: {rate}\n"
    )
    return ["--tracing-config-file", str(config)]


def _totals(dump: Path) -> int:
    totals = [line for line in dump.read_text(errors="replace").splitlines() if line.startswith("totals:")]
    if not totals:
        raise RuntimeError(f"callgrind wrote no totals in {dump}")
    return int(totals[-1].split()[1])


# Left out of every count, busy and idle windows alike (inclusive, from callgrind_annotate):
# - the cyclic collector's runs: a request leaves a few cyclic objects (aiohttp's task and parsed
#   message), and with the gateway's young threshold (`util/runtime.py`) one collection of a few
#   hundred requests' worth (about 11M instructions) comes every few hundred requests, so a window
#   of a hundred to a few thousand holds one, two or none at random: up to 100k per request;
# - TLS handshakes: new connections, not requests (seen only in busy windows, 10-26M in some,
#   which connections not traced).
ONE_OFF = ("gc_collect_main", "_ssl__SSLSocket_do_handshake")


def _one_off(dump: Path) -> int:
    """The instructions of `ONE_OFF`'s runs in a dump."""
    return sum(inclusive(dump, ONE_OFF).values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--baseline-src", help="another checkout to measure in the same run")
    parser.add_argument(
        "--baseline-us",
        type=float,
        help="the baseline's CPU µs per request as proxy.py measured it on some machine: this tree's "
        "is then estimated for that machine by the ratio of instructions",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of each tree")
    parser.add_argument(
        "--keep", type=Path, help="a folder to keep callgrind's files in (callgrind_annotate)"
    )
    parser.add_argument("--gateway-args", default="", help="extra `aggregator serve` flags, space-separated")
    parser.add_argument(
        "--tracing-rate",
        type=int,
        help="also measure this tree with --tracing-config-file at this samplingRatePerMillion",
    )
    parser.add_argument(
        "--compare-apf",
        action="store_true",
        help="also measure this tree with API Priority and Fairness off (max-in-flight), as a user APF does not exempt",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        work = Path(tmp)
        ports, pki, folder = prepare(work)
        gateway_args = [
            # One process: callgrind counts the process it started, not workers it would spawn.
            "--workers", "1",
            "--client-ca-file", str(pki / "client-ca.crt"),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
            *args.gateway_args.split(),
        ]  # fmt: skip
        trees: list[tuple[str, str | None, list[str]]] = [("this tree", None, gateway_args)]
        if args.tracing_rate is not None:
            trees.append((f"tracing {args.tracing_rate}", None, [*gateway_args, *tracing_args(work, args.tracing_rate)]))
        if args.compare_apf:
            trees.append(("APF off", None, [*gateway_args, APF_OFF]))
        if args.baseline_src:
            trees.append(("baseline", args.baseline_src, gateway_args))
        client = "admin"
        if args.compare_apf:
            client = BENCH_USER
            write_pair(pki, client, issue_client_cert(load_pair(pki, "client-ca"), BENCH_USER, ()))
        results: dict[str, list[Counted]] = {label: [] for label, _, _ in trees}
        with (
            nginx(work, "backend", backend_conf(work, ports), None),
            nginx(work, "front", front_conf(work, ports, client), None),
        ):
            for _ in range(args.rounds):
                for label, src, flags in trees:
                    counted = count(label, work, ports, pki, folder, flags, src, args.seconds, args.keep)
                    print(counted.line(), flush=True)
                    results[label].append(counted)
    mean = {label: sum(c.per_request for c in runs) / len(runs) for label, runs in results.items()}
    print(
        f"\nGET {PATH} through the gateway under callgrind, 1 keep-alive connection, {args.seconds}s per round"
    )
    for label, value in mean.items():
        print(f"{label:<12} {value / 1000:>6.0f}k instructions/request (mean of {len(results[label])})")
    for label in mean:
        if label.startswith("tracing"):
            print(f"{label}: {mean[label] / mean['this tree']:.4f}x this tree's instructions without tracing")
            if "baseline" in mean:
                print(f"{label}: {mean[label] / mean['baseline']:.4f}x the baseline's")
    if "APF off" in mean:
        print(f"API Priority and Fairness on: {mean['this tree'] / mean['APF off']:.3f}x the instructions per request of off")
    if "baseline" in mean:
        ratio = mean["this tree"] / mean["baseline"]
        print(f"this tree: {ratio:.2f}x the baseline's instructions per request")
        if args.baseline_us:
            print(
                f"where the baseline took {args.baseline_us:.0f} µs per request: about {ratio * args.baseline_us:.0f} µs"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
