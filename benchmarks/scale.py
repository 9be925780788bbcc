"""Benchmark: the gateway with thousands of APIServices (each with its own Service and EndpointSlice).

Run from the repository root:
    .venv/bin/python benchmarks/scale.py [--counts 5000,20000] [--backends healthy,dead,blackhole]
        [--workers default,1] [--addresses one,distinct] [--rounds 2]

For each kind of backend, each count, each way of placing the Services and each worker count, a
local-mode gateway (client CA and front-proxy CA configured) starts on a folder of manifests:
- `healthy`: nginx over TLS answers for every Service (a wildcard certificate covers every
  `<service>.bench.svc`). It serves each group (picked by the TLS server name) as an extension
  server does: aggregated discovery, an APIResourceList for the availability probe, OpenAPI v3
  and v2, with ETags and 304s; every APIService causes the background traffic a real one causes;
- `dead`: nothing listens where the Services point: each dial is refused;
- `blackhole`: a process accepts every TCP connection and never says a word (a hung pod, a
  firewall that accepts and drops): each dial hangs until its timeout.
`--addresses one` puts every Service at one address (127.0.0.1 for nginx, 127.1.0.1 otherwise),
`distinct` gives each its own loopback address (127.1.x.y, as every Service has its own cluster
IP; nginx then listens on every address of its port). `--workers default` leaves `--workers`
unset, as shipped (one worker per CPU the gateway may use: the gateway is not pinned, so 2 here);
`1` runs one process.

The script prints, for the gateway's whole process tree (control and workers, from /proc):
- time to listening (the port accepts connections) and to ready (`/readyz` 200);
- time until every APIService's verdict was in (`verdicts`: healthy, all Available; dead and
  blackhole, all unavailable), polled every 3 s or so;
- time until settled (healthy: every APIService Available; dead: a minute after every APIService
  was found unavailable, so every retry is at its 30 s cap; blackhole: a minute past ready; and
  the gateway's CPU below 20% over a second);
- RSS (the sum over the tree) once settled, and again after the idle window, then each process's
  RSS and PSS (shared pages divided among the processes that map them) on a line of its own;
- idle CPU over a window after settling (background probes, discovery and OpenAPI refreshes only;
  a full minute by default, so every loop's period is counted once), and the highest 20-second
  window from 60 s after start on;
- how long a new manifest written to the folder takes to appear in `/apis` on every worker, and
  its first verdict to reach every worker (healthy: a proxied GET answers 200 on a connection to
  each worker; otherwise each worker's `/readyz?verbose` names it unavailable).
nginx (or the blackhole) is pinned to the last CPU where the machine has two or more; the
gateway is not pinned, since that would change its default worker count.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from wrkbench import cpu_seconds, free_port, pinning, rss_bytes, tree, tree_cpu

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
RESOURCE_LIST = '{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"x/v1","resources":[]}'
AGGREGATED_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
PER_FILE = 100
BACKENDS = ("healthy", "dead", "blackhole")
ADDRESSES = ("one", "distinct")
WORKERS = ("default", "1")
# CPU windows for "from 60 s after start".
WINDOW = 20.0
FROM_START = 60.0


def nginx_conf(work: Path, port: int, listen: str) -> str:
    """One nginx is every backend: the TLS server name (`svcNNNNN.bench.svc`) picks the group, and
    each group's documents are static files, so nginx adds ETags and answers revalidations with 304
    as real extension servers (k8s.io/apiserver, kube-openapi) do."""
    return f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
worker_rlimit_nofile 60000;
events {{ worker_connections 50000; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path {work}/nginx-body;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {work}/backend.crt;
    ssl_certificate_key {work}/backend.key;
    map $ssl_server_name $group {{ ~^svc(?<n>[0-9]+)[.]bench[.]svc$ group$n; }}
    types {{ }}
    server {{
        listen {listen} ssl backlog=4096;
        ssl_client_certificate {work}/pki/front-proxy-ca.crt;
        ssl_verify_client on;
        root {work}/backend/$group;
        location = /apis {{ default_type "{AGGREGATED_TYPE}"; try_files /apis.json =404; }}
        location /apis/ {{ default_type application/json; return 200 '{RESOURCE_LIST}'; }}
        location = /openapi/v3 {{ default_type application/json; try_files /v3.json =404; }}
        location /openapi/v3/ {{ default_type application/json; try_files /v3-doc.json =404; }}
        location = /openapi/v2 {{ default_type application/json; try_files /v2.json =404; }}
    }}
}}
"""


def backend_documents(root: Path, index: int) -> None:
    """What group `index`'s extension server serves: aggregated discovery and OpenAPI v3 and v2."""
    group = f"group{index:05d}.bench.example.com"
    folder = root / f"group{index:05d}"
    folder.mkdir(parents=True)
    resource = {
        "resource": "things",
        "responseKind": {"group": group, "version": "v1", "kind": "Thing"},
        "scope": "Namespaced",
        "singularResource": "thing",
        "verbs": ["get", "list", "watch"],
    }
    aggregated = {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{"metadata": {"name": group}, "versions": [{"version": "v1", "resources": [resource]}]}],
    }
    (folder / "apis.json").write_text(json.dumps(aggregated))
    doc = {"openapi": "3.0.0", "info": {"title": group, "version": "v1"}, "paths": {}}
    digest = hashlib.sha512(json.dumps(doc).encode()).hexdigest().upper()
    (folder / "v3-doc.json").write_text(json.dumps(doc))
    index_doc = {
        "paths": {f"apis/{group}/v1": {"serverRelativeURL": f"/openapi/v3/apis/{group}/v1?hash={digest}"}}
    }
    (folder / "v3.json").write_text(json.dumps(index_doc))
    (folder / "v2.json").write_text(
        json.dumps({"swagger": "2.0", "info": {"title": group, "version": "v1"}, "paths": {}})
    )


# Accepts every connection on every local address of `port` and never reads or writes; a
# connection is dropped when its peer closes it.
BLACKHOLE = """
import asyncio, sys
class Silent(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def connection_lost(self, exc): pass
async def main():
    server = await asyncio.get_running_loop().create_server(Silent, "0.0.0.0", int(sys.argv[1]), backlog=4096)
    await server.serve_forever()
asyncio.run(main())
"""


@dataclass(frozen=True)
class Scenario:
    kind: str  # healthy, dead, blackhole
    addresses: str  # one, distinct
    workers: str  # default, or a count
    count: int

    def address(self, index: int) -> str:
        if self.addresses == "distinct":
            return f"127.1.{index // 250}.{index % 250 + 1}"
        return "127.0.0.1" if self.kind == "healthy" else "127.1.0.1"

    def row(self) -> str:
        return f"{self.kind:>9} {self.addresses:>9} {self.workers:>7} {self.count:>6}"


def apiservice_name(index: int) -> str:
    return f"v1.group{index:05d}.bench.example.com"


def objects(scenario: Scenario, index: int, port: int, ca_pem_b64: str) -> list[dict[str, object]]:
    group, name = f"group{index:05d}.bench.example.com", f"svc{index:05d}"
    address = scenario.address(index)
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"v1.{group}"},
            "spec": {
                "group": group,
                "version": "v1",
                "service": {"namespace": "bench", "name": name, "port": port},
                "caBundle": ca_pem_b64,
                "groupPriorityMinimum": 1000 + index % 500,
                "versionPriority": 15,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": "bench", "name": name},
            "spec": {"clusterIP": address, "ports": [{"name": "https", "port": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": "bench",
                "name": f"{name}-1",
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    ]


def write_folder(folder: Path, scenario: Scenario, port: int, ca_pem_b64: str) -> None:
    if scenario.kind == "healthy":
        for index in range(scenario.count + 1):  # one more for the manifest added at the end
            backend_documents(folder.parent / "backend", index)
    count = scenario.count
    for start in range(0, count, PER_FILE):
        docs = [
            d
            for i in range(start, min(count, start + PER_FILE))
            for d in objects(scenario, i, port, ca_pem_b64)
        ]
        (folder / f"apiservices-{start:05d}.yaml").write_text(yaml.safe_dump_all(docs))


def client_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return ctx


class Client:
    """A new connection per request (so a request may land on any worker)."""

    def __init__(self, base: str, pki: Path) -> None:
        self.base = base
        self.ctx = client_context(pki)

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, context=self.ctx, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


WORKER_LINE = re.compile(rb"info: worker (\d+) of (\d+)")


class WorkerConnections:
    """One keep-alive connection to each worker (`/livez?verbose` says which one answered)."""

    def __init__(self, port: int, pki: Path) -> None:
        self.connections: dict[str, http.client.HTTPSConnection] = {}
        ctx = client_context(pki)
        expected: int | None = None
        for _ in range(200):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
            _status, body = self._get(conn, "/livez?verbose")
            match = WORKER_LINE.search(body)
            index, total = (match.group(1).decode(), int(match.group(2))) if match else ("single", 1)
            expected = total
            if index in self.connections:
                conn.close()
            else:
                self.connections[index] = conn
            if len(self.connections) == expected:
                return
        raise RuntimeError(f"reached {len(self.connections)} of {expected} workers")

    @staticmethod
    def _get(conn: http.client.HTTPSConnection, path: str) -> tuple[int, bytes]:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()

    def until_all(self, path: str, done: Callable[[int, bytes], bool], limit: float = 60.0) -> float:
        """Seconds until `done(status, body)` held on every worker's connection."""
        started = time.monotonic()
        waiting = dict(self.connections)
        while waiting:
            for index, conn in list(waiting.items()):
                if done(*self._get(conn, path)):
                    del waiting[index]
            if time.monotonic() - started > limit:
                raise RuntimeError(f"{path}: workers {sorted(waiting)} never answered as expected")
            time.sleep(0.005)
        return time.monotonic() - started

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()


@contextlib.contextmanager
def backends(scenario: Scenario, work: Path, port: int, cpus: str | None) -> Iterator[None]:
    """What answers on the backends' port: nginx, nothing at all, or the blackhole."""
    if scenario.kind == "healthy":
        listen = f"127.0.0.1:{port}" if scenario.addresses == "one" else str(port)
        with nginx(work, listen, cpus):
            yield
    elif scenario.kind == "dead":
        yield
    else:
        proc = subprocess.Popen([*pinning(cpus), sys.executable, "-c", BLACKHOLE, str(port)])
        try:
            while True:  # listening?
                with contextlib.suppress(OSError), socket.create_connection(("127.1.0.1", port), 0.2):
                    break
                time.sleep(0.05)
            yield
        finally:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def nginx(work: Path, listen: str, cpus: str | None) -> Iterator[None]:
    conf = work / "nginx.conf"
    conf.write_text(nginx_conf(work, int(listen.rsplit(":", 1)[-1]), listen))
    proc = subprocess.Popen([*pinning(cpus), NGINX, "-c", str(conf), "-e", str(work / "nginx-error.log")])
    try:
        yield
    finally:
        proc.send_signal(signal.SIGQUIT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def tree_rss(pid: int) -> float:
    """MiB, summed over the tree (shared pages counted in each process, as `ps` would)."""
    total = 0
    for member in tree(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += rss_bytes(member)
    return total / 2**20


def per_process(pid: int) -> dict[str, float]:
    """RSS and PSS in MiB of each process of the tree (`rss:control`, `pss:worker1`, ...), from
    /proc/<pid>/smaps_rollup: RSS counts shared pages in each process (as the tree's sum above
    does), PSS divides them among the processes that share them."""
    figures: dict[str, float] = {}
    workers = 0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{member}/smaps_rollup").read_text()
            fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:] if ":" in line)
            if member == pid:
                role = "control"
            else:
                role, workers = f"worker{workers}", workers + 1
            figures[f"rss:{role}"] = int(fields["Rss"].split()[0]) / 1024
            figures[f"pss:{role}"] = int(fields["Pss"].split()[0]) / 1024
    return figures


def cpu_fraction(pid: int, seconds: float) -> float:
    before, started = tree_cpu(pid), time.monotonic()
    time.sleep(seconds)
    return (tree_cpu(pid) - before) / (time.monotonic() - started)


class Windows:
    """The tree's CPU in WINDOW-second slices since start, sampled by a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fractions: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = tree_cpu(self.pid)
        while not self._stop.wait(WINDOW):
            now = tree_cpu(self.pid)
            self.fractions.append((now - last) / WINDOW)
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def worst_after(self, seconds: float) -> float:
        """The highest window starting at `seconds` after start or later."""
        later = self.fractions[int(seconds // WINDOW) :]
        return max(later) if later else float("nan")


VERDICT_LINE = re.compile(r"APIService availability changed apiservice=(\S+) .*?new_status=(\S+)")


def verdict_counts(log_path: Path) -> tuple[int, int]:
    """(APIServices found Available, APIServices found not Available) by the gateway's checks, from
    its log (each flip is a line): asking the gateway would cost it more than the checks do (a
    list of every APIService, or a scrape of every APIService's series), and show in the figures."""
    last: dict[str, str] = {}
    with log_path.open(errors="replace") as lines:
        for line in lines:
            match = VERDICT_LINE.search(line)
            if match:
                last[match.group(1)] = match.group(2)
    statuses = list(last.values())
    return statuses.count("True"), statuses.count("False")


# Retries of a failed check double from 0.5 s to the 30 s cap: a minute after its first verdict,
# a dead backend is retried at the cap (the steady state the idle window measures).
RETRIES_AT_CAP = 60.0


def settled(log_path: Path, scenario: Scenario, since: dict[str, float]) -> bool:
    """`since` holds when the first verdicts were all in (dead backends), set here."""
    now = time.monotonic()
    if scenario.kind == "healthy":
        if "verdicts" not in since and verdict_counts(log_path)[0] == scenario.count:
            since["verdicts"] = now
        return "verdicts" in since
    if scenario.kind == "blackhole":
        # A blackholed backend's verdict takes a probe timeout (5 checks at a time, as upstream),
        # so they keep coming in for a long time: the idle window covers those checks.
        return now - since["ready"] >= RETRIES_AT_CAP
    if "verdicts" not in since and verdict_counts(log_path)[1] == scenario.count:
        since["verdicts"] = now
    return "verdicts" in since and now - since["verdicts"] >= RETRIES_AT_CAP


def gateway_command(work: Path, pki: Path, folder: Path, port: int, workers: str) -> list[str]:
    return [
        sys.executable, "-m", "aggregator", "serve",
        "--apiservices-dir", str(folder), "--bind-address", "127.0.0.1", "--secure-port", str(port),
        "--cert-dir", str(work / "certs"),
        "--client-ca-file", str(pki / "client-ca.crt"),
        "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
        "--requestheader-allowed-names", "front-proxy-client",
        "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
        "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
        *([] if workers == "default" else ["--workers", workers]),
    ]  # fmt: skip


def run(scenario: Scenario, idle_window: float, other_cpus: str | None, figures: dict[str, float]) -> None:
    """Fills `figures` as they are measured (a run that fails keeps what it measured)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{scenario.kind}-{scenario.count}-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # nginx's workers (another user) read the backends' documents
        pki = work / "pki"
        init_pki(pki)
        ca = new_ca("bench-backend-ca")
        write_pair(work, "backend", issue_serving_cert(ca, ["*.bench.svc", "127.0.0.1"]))
        ca_b64 = base64.b64encode(ca.cert_pem).decode()
        folder = work / "apiservices"
        folder.mkdir()
        backend_port, port = free_port(), free_port()
        write_folder(folder, scenario, backend_port, ca_b64)
        cmd = gateway_command(work, pki, folder, port, scenario.workers)
        with backends(scenario, work, backend_port, other_cpus):
            log = (work / "gateway.log").open("w")
            started = time.monotonic()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.environ.get("BENCH_GATEWAY_SRC")
            )
            windows = Windows(proc.pid)
            client = Client(f"https://127.0.0.1:{port}", pki)
            try:
                while "listening" not in figures:
                    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                        figures["listening"] = time.monotonic() - started
                    if proc.poll() is not None:
                        raise RuntimeError(f"the gateway exited; see {work / 'gateway.log'}")
                    time.sleep(0.05)
                while "ready" not in figures:
                    with contextlib.suppress(OSError):
                        if client.get("/readyz", timeout=5)[0] == 200:
                            figures["ready"] = time.monotonic() - started
                    if time.monotonic() - started > 600:
                        raise RuntimeError("not ready after 10 minutes")
                    time.sleep(0.1)
                since = {"ready": started + figures["ready"]}
                while "settled" not in figures:
                    if settled(work / "gateway.log", scenario, since) and cpu_fraction(proc.pid, 1.0) < 0.2:
                        figures["settled"] = time.monotonic() - started
                        break
                    time.sleep(2.0)
                    if time.monotonic() - started > 900:
                        figures["cpu_to_settle"] = tree_cpu(proc.pid)
                        figures["rss_mib"] = tree_rss(proc.pid)
                        counts = verdict_counts(work / "gateway.log")
                        raise RuntimeError(f"not settled after 15 minutes ({counts} Available, not)")
                if "verdicts" in since:
                    figures["verdicts"] = since["verdicts"] - started
                figures["cpu_to_settle"] = tree_cpu(proc.pid)
                figures["rss_mib"] = tree_rss(proc.pid)
                # Idle from 60 s after start on (and after settling), for a full window.
                time.sleep(max(0.0, started + FROM_START - time.monotonic()))
                control_before, idle_started = cpu_seconds(proc.pid), time.monotonic()
                figures["idle_cpu_percent"] = 100 * cpu_fraction(proc.pid, idle_window)
                control = cpu_seconds(proc.pid) - control_before
                figures["idle_control_percent"] = 100 * control / (time.monotonic() - idle_started)
                # After a full minute of background traffic: start-up's spare connections have closed.
                figures["steady_rss_mib"] = tree_rss(proc.pid)
                figures.update(per_process(proc.pid))
                figures["worst_window_percent"] = 100 * windows.worst_after(FROM_START)
                figures["log_lines"] = sum(1 for _ in (work / "gateway.log").open())
                figures.update(new_manifest(scenario, folder, port, pki, backend_port, ca_b64))
            except BaseException:
                # The temporary folder goes away with the run: keep the log that says why it failed.
                kept = Path(tempfile.gettempdir()) / f"scale-failed-{scenario.kind}-{scenario.count}-{os.getpid()}.log"
                shutil.copyfile(work / "gateway.log", kept)
                print(f"   the gateway's log: {kept} (exit status {proc.poll()})", flush=True)
                raise
            finally:
                windows.stop()
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.poll() is None:
                    proc.kill()
                log.close()


def new_manifest(
    scenario: Scenario, folder: Path, port: int, pki: Path, backend_port: int, ca_b64: str
) -> dict[str, float]:
    """One more manifest: how long until every worker lists its group in `/apis`, and until its
    first verdict reached every worker."""
    workers = WorkerConnections(port, pki)
    try:
        extra = objects(scenario, scenario.count, backend_port, ca_b64)
        group = b"group%05d.bench.example.com" % scenario.count
        name = apiservice_name(scenario.count)
        changed = time.monotonic()
        (folder / "zz-new.yaml").write_text(yaml.safe_dump_all(extra))
        to_apis = workers.until_all("/apis", lambda _status, body: group in body, limit=30)
        if scenario.kind == "healthy":
            workers.until_all(f"/apis/{group.decode()}/v1", lambda status, _body: status == 200)
        elif scenario.kind == "dead":
            # Its Available=False condition, written as the verdict comes (one small object per
            # poll: `/readyz?verbose` would list thousands of unavailable APIServices each time).
            workers.until_all(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", found_unavailable)
        else:  # a blackholed check waits for a free slot, then hangs for its timeout: not a latency
            return {"file_to_apis_ms": to_apis * 1000, "file_to_verdict_ms": float("nan")}
        return {"file_to_apis_ms": to_apis * 1000, "file_to_verdict_ms": (time.monotonic() - changed) * 1000}
    finally:
        workers.close()


def found_unavailable(status: int, body: bytes) -> bool:
    """The APIService's Available condition says False."""
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "False" for c in conditions)


HEADER = (
    f"{'backends':>9} {'addresses':>9} {'workers':>7} {'count':>6} {'listening':>9} {'ready':>7} "
    f"{'verdicts':>8} {'settled':>8} {'CPU to settle':>13} {'RSS settled':>11} {'idle CPU':>8} {'control':>7} {'worst 20s':>9} "
    f"{'RSS steady':>10} {'log lines':>9} {'file->/apis':>11} {'->verdict':>10}"
)


def line(scenario: Scenario, figures: dict[str, float]) -> str:
    f = defaultdict(lambda: float("nan"), figures)
    return (
        f"{scenario.row()} {f['listening']:>8.1f}s {f['ready']:>6.1f}s {f['verdicts']:>7.1f}s {f['settled']:>7.1f}s "
        f"{f['cpu_to_settle']:>12.1f}s {f['rss_mib']:>7.0f} MiB {f['idle_cpu_percent']:>7.1f}% "
        f"{f['idle_control_percent']:>6.1f}% "
        f"{f['worst_window_percent']:>8.1f}% {f['steady_rss_mib']:>6.0f} MiB {f['log_lines']:>9.0f} "
        f"{f['file_to_apis_ms']:>8.0f} ms {f['file_to_verdict_ms']:>7.0f} ms"
    )


def per_process_line(figures: dict[str, float]) -> str:
    """The steady RSS and PSS of each process, and the tree's PSS (empty if not measured)."""
    roles = [key.split(":", 1)[1] for key in figures if key.startswith("rss:")]
    if not roles:
        return ""
    each = ", ".join(f"{role} {figures['rss:' + role]:.1f}/{figures['pss:' + role]:.1f}" for role in roles)
    pss = sum(figures["pss:" + role] for role in roles)
    return f"    steady, MiB RSS/PSS: {each}; PSS of the tree {pss:.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="5000,20000")
    parser.add_argument(
        "--backends",
        default="dead,blackhole,healthy",
        help=f"comma-separated kinds of backend: {', '.join(BACKENDS)}",
    )
    parser.add_argument("--addresses", default="one,distinct", help="one, distinct, or both")
    parser.add_argument(
        "--workers", default="default,1", help="comma-separated: default (unset) and/or counts"
    )
    parser.add_argument("--rounds", type=int, default=1, help="run every scenario this many times")
    parser.add_argument(
        "--idle-window",
        type=float,
        default=60.0,
        help="seconds of idle CPU measurement (a full refresh period)",
    )
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    other_cpus = str(cpus - 1) if cpus >= 2 else None
    kinds = [k for k in args.backends.split(",") if k]
    unknown = [k for k in kinds if k not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
    placements = [a for a in args.addresses.split(",") if a]
    if any(a not in ADDRESSES for a in placements):
        parser.error(f"--addresses: choose from {', '.join(ADDRESSES)}")
    workers = [w for w in args.workers.split(",") if w]
    if any(w != "default" and not w.isdigit() for w in workers):
        parser.error("--workers: `default` or a count")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    print(HEADER, flush=True)
    for _ in range(args.rounds):
        for kind in kinds:
            for count in (int(c) for c in args.counts.split(",")):
                for placement in placements:
                    for worker in workers:
                        scenario = Scenario(kind, placement, worker, count)
                        figures: dict[str, float] = {}
                        failure = ""
                        try:
                            run(scenario, args.idle_window, other_cpus, figures)
                        except (RuntimeError, OSError) as err:
                            failure = f"   FAILED: {err}"
                        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                        print(f"{line(scenario, figures)}   load {load}{failure}", flush=True)
                        if per_process_line(figures):
                            print(per_process_line(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
