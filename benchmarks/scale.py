"""Benchmark: the gateway at 100, 1000 and 5000 APIServices (each with its own Service and EndpointSlice).

Run from the repository root:
    .venv/bin/python benchmarks/scale.py [--counts 100,1000,5000] [--backends healthy,dead,blackhole]

For each kind of backend and each count, a local-mode gateway (client CA and front-proxy CA
configured) starts on a folder of manifests:
- `healthy`: every Service points at one nginx over TLS (a wildcard certificate covers every
  `<service>.bench.svc`). nginx serves each group (picked by the TLS server name) as an extension
  server does: aggregated discovery, an APIResourceList for the availability probe, OpenAPI v3
  and v2, with ETags and 304s; every APIService causes the background traffic a real one causes;
- `dead`: every Service has its own loopback address (127.1.x.y, as every Service has its own
  cluster IP) where nothing listens: each dial is refused;
- `blackhole`: the same addresses, where a process accepts every TCP connection and never says a
  word (a hung pod, a firewall that accepts and drops): each dial hangs until its timeout.
The script prints:
- time to listening (the port accepts connections) and to ready (`/readyz` 200);
- time until settled (healthy: every APIService Available; dead: a minute after every APIService
  was found unavailable, so every retry is at its 30 s cap; blackhole: a minute past ready; and
  the gateway's CPU below 20% over a second);
- RSS once settled, and again after the idle window (steady state: start-up's spare connections
  to the backends have closed by then);
- idle CPU over a window after settling (background probes, discovery and OpenAPI refreshes only;
  a full minute by default, so every loop's period is counted once);
- how long a new manifest written to the folder takes to appear in `/apis` (healthy backends).
The gateway is pinned to CPU 0 and nginx (or the blackhole) to the others where the machine has
two CPUs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from wrkbench import cpu_seconds, free_port, pinning, rss_bytes

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
RESOURCE_LIST = '{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"x/v1","resources":[]}'
AGGREGATED_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
PER_FILE = 100


def nginx_conf(work: Path, port: int) -> str:
    """One nginx is every backend: the TLS server name (`svcNNNNN.bench.svc`) picks the group, and
    each group's documents are static files, so nginx adds ETags and answers revalidations with 304
    as real extension servers (k8s.io/apiserver, kube-openapi) do."""
    return f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
worker_rlimit_nofile 30000;
events {{ worker_connections 20000; }}
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
        listen 127.0.0.1:{port} ssl backlog=4096;
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
    index_doc = {"paths": {f"apis/{group}/v1": {"serverRelativeURL": f"/openapi/v3/apis/{group}/v1?hash={digest}"}}}
    (folder / "v3.json").write_text(json.dumps(index_doc))
    (folder / "v2.json").write_text(json.dumps({"swagger": "2.0", "info": {"title": group, "version": "v1"}, "paths": {}}))


BACKENDS = ("healthy", "dead", "blackhole")
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


def backend_address(index: int, kind: str) -> str:
    """One nginx for healthy backends; otherwise a loopback address of its own per Service."""
    if kind == "healthy":
        return "127.0.0.1"
    return f"127.1.{index // 250}.{index % 250 + 1}"


def objects(index: int, port: int, ca_pem_b64: str, kind: str = "healthy") -> list[dict[str, object]]:
    group, name = f"group{index:05d}.bench.example.com", f"svc{index:05d}"
    address = backend_address(index, kind)
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
            "metadata": {"namespace": "bench", "name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    ]


def write_folder(folder: Path, count: int, port: int, ca_pem_b64: str, kind: str) -> None:
    if kind == "healthy":
        for index in range(count + 1):  # one more for the manifest added at the end
            backend_documents(folder.parent / "backend", index)
    for start in range(0, count, PER_FILE):
        docs = [d for i in range(start, min(count, start + PER_FILE)) for d in objects(i, port, ca_pem_b64, kind)]
        (folder / f"apiservices-{start:05d}.yaml").write_text(yaml.safe_dump_all(docs))


class Client:
    def __init__(self, base: str, pki: Path) -> None:
        self.base = base
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        self.ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, context=self.ctx, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


@contextlib.contextmanager
def backends(kind: str, work: Path, port: int, cpus: str | None) -> Iterator[None]:
    """What answers on the backends' port: nginx, nothing at all, or the blackhole."""
    if kind == "healthy":
        with nginx(work, port, cpus):
            yield
    elif kind == "dead":
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
def nginx(work: Path, port: int, cpus: str | None) -> Iterator[None]:
    conf = work / "nginx.conf"
    conf.write_text(nginx_conf(work, port))
    proc = subprocess.Popen([*pinning(cpus), NGINX, "-c", str(conf), "-e", str(work / "nginx-error.log")])
    try:
        yield
    finally:
        proc.send_signal(signal.SIGQUIT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def cpu_fraction(pid: int, seconds: float) -> float:
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def verdict_counts(client: Client) -> tuple[int, int]:
    """(APIServices found Available, APIServices found not Available) by the gateway's checks."""
    _, body = client.get("/apis/apiregistration.k8s.io/v1/apiservices", timeout=60)
    available = unavailable = 0
    for item in json.loads(body)["items"]:
        for c in item.get("status", {}).get("conditions", []):
            if c["type"] == "Available":
                available += c["status"] == "True"
                unavailable += c["status"] == "False"
    return available, unavailable


# Retries of a failed check double from 0.5 s to the 30 s cap: a minute after its first verdict,
# a dead backend is retried at the cap (the steady state the idle window measures).
RETRIES_AT_CAP = 60.0


def settled(client: Client, count: int, kind: str, since: dict[str, float]) -> bool:
    """`since` holds when the first verdicts were all in (dead backends), set here."""
    if kind == "healthy":
        return verdict_counts(client)[0] == count
    now = time.monotonic()
    if kind == "blackhole":
        # A blackholed backend's verdict takes a probe timeout (5 checks at a time, as upstream),
        # so they keep coming in for a long time: the idle window covers those checks.
        return now - since["ready"] >= RETRIES_AT_CAP
    if "verdicts" not in since and verdict_counts(client)[1] == count:
        since["verdicts"] = now
    return "verdicts" in since and now - since["verdicts"] >= RETRIES_AT_CAP


def run(
    count: int, kind: str, idle_window: float, server_cpu: str | None, other_cpus: str | None
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{kind}-{count}-") as tmp:
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
        write_folder(folder, count, backend_port, ca_b64, kind)
        cmd = [
            *pinning(server_cpu), sys.executable, "-m", "aggregator", "serve",
            "--apiservices-dir", str(folder), "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--cert-dir", str(work / "certs"),
            "--client-ca-file", str(pki / "client-ca.crt"),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
        ]  # fmt: skip
        with backends(kind, work, backend_port, other_cpus):
            log = (work / "gateway.log").open("w")
            started = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.environ.get("BENCH_GATEWAY_SRC"))
            client = Client(f"https://127.0.0.1:{port}", pki)
            figures: dict[str, float] = {}
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
                    if settled(client, count, kind, since) and cpu_fraction(proc.pid, 1.0) < 0.2:
                        figures["settled"] = time.monotonic() - started
                    elif time.monotonic() - started > 900:
                        raise RuntimeError("not settled after 15 minutes")
                figures["cpu_to_settle"] = cpu_seconds(proc.pid)
                figures["rss_mib"] = rss_bytes(proc.pid) / 2**20
                figures["idle_cpu_percent"] = 100 * cpu_fraction(proc.pid, idle_window)
                # After a full minute of background traffic: start-up's spare connections have closed.
                figures["steady_rss_mib"] = rss_bytes(proc.pid) / 2**20
                figures["log_lines"] = sum(1 for _ in (work / "gateway.log").open())
                # One more manifest: how long until /apis lists its group?
                extra = objects(count, backend_port, ca_b64, kind)
                changed = time.monotonic()
                (folder / "zz-new.yaml").write_text(yaml.safe_dump_all(extra))
                group = b"group%05d.bench.example.com" % count
                while group not in client.get("/apis")[1]:
                    if time.monotonic() - changed > 30:
                        raise RuntimeError("the new group never appeared in /apis")
                    time.sleep(0.005)
                figures["file_to_apis_ms"] = (time.monotonic() - changed) * 1000
            finally:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.poll() is None:
                    proc.kill()
                log.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="100,1000,5000")
    parser.add_argument(
        "--backends", default="healthy", help=f"comma-separated kinds of backend: {', '.join(BACKENDS)}"
    )
    parser.add_argument(
        "--idle-window", type=float, default=60.0, help="seconds of idle CPU measurement (a full refresh period)"
    )
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    server_cpu, other_cpus = ("0", f"1-{cpus - 1}") if cpus >= 2 else (None, None)
    kinds = [k for k in args.backends.split(",") if k]
    unknown = [k for k in kinds if k not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
    print(f"{'backends':>9} {'APIServices':>11} {'listening':>10} {'ready':>8} {'settled':>8} {'CPU to settle':>14} "
          f"{'RSS settled':>12} {'idle CPU':>9} {'RSS steady':>11} {'log lines':>10} {'file -> /apis':>14}")  # fmt: skip
    for kind in kinds:
        for count in (int(c) for c in args.counts.split(",")):
            f = run(count, kind, args.idle_window, server_cpu, other_cpus)
            print(
                f"{kind:>9} {count:>11} {f['listening']:>9.1f}s {f['ready']:>7.1f}s {f['settled']:>7.1f}s "
                f"{f['cpu_to_settle']:>13.1f}s {f['rss_mib']:>8.0f} MiB {f['idle_cpu_percent']:>8.1f}% "
                f"{f['steady_rss_mib']:>7.0f} MiB {f['log_lines']:>10.0f} {f['file_to_apis_ms']:>11.0f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
