"""Benchmark: proxied GETs the way users send them, against a fast TLS backend, with wrk.

Run from the repository root:  .venv/bin/python benchmarks/proxy.py [--seconds 10] [--connections 32]

Callers present client certificates over keep-alive TLS and the gateway runs with its client CA
and a front-proxy (`--requestheader-client-ca-file`) CA configured, as kube mode always is: wrk
cannot present a certificate, so it talks plain HTTP to an nginx "front" that re-sends each
request over TLS with the admin client certificate on pooled connections. The backend is nginx
with a listener that demands the front-proxy client certificate and `X-Remote-User`.

Three paths, same wrk settings, one after the other after a warm-up:
- direct: front -> backend (nginx straight to nginx: the floor);
- nginx as a reverse proxy in the gateway's place: front -> nginx proxy -> backend (the baseline
  a fast C proxy sets; its process's CPU per request is measured the same way);
- gateway: front -> gateway -> backend.
For the gateway and the nginx proxy the script prints requests/s, p50/p99, the CPU microseconds
their process spent per request (utime+stime from /proc), and the gateway's RSS before and after.
Where the machine has at least 2 CPUs the gateway (or the nginx proxy) is pinned to CPU 0 and the
rest to the others with taskset. On a small machine the figures are ratios, not capacities.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from wrkbench import (
    WrkResult,
    cpu_seconds,
    free_port,
    gateway_process,
    pinning,
    registration,
    rss_bytes,
    run_wrk,
    wait_for_http,
)

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
GROUP, VERSION = "bench.example.com", "v1"
PATH = f"/apis/{GROUP}/{VERSION}/namespaces/default/things/thing-1"
# A typical small object, about 700 bytes, like a `kubectl get` of one resource.
DOCUMENT = (
    '{"kind":"Thing","apiVersion":"bench.example.com/v1","metadata":{"name":"thing-1",'
    '"namespace":"default","uid":"6f1c9a52-2d3c-4b8e-9f3a-0c7d1e2b4a55","resourceVersion":"123456",'
    '"creationTimestamp":"2026-11-22T10:00:00Z","labels":{"app":"bench","tier":"backend"},'
    '"annotations":{"example.com/owner":"team-a"}},"spec":{"replicas":3,"image":"registry.example.com/'
    'bench/thing:1.2.3","ports":[{"name":"https","port":8443}],"resources":{"requests":{"cpu":"100m",'
    '"memory":"128Mi"}}},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True",'
    '"lastTransitionTime":"2026-11-22T10:00:05Z"}]}}'
)


@dataclass(frozen=True)
class Ports:
    front_direct: int  # plain HTTP: wrk -> front -> backend
    front_nginx: int  # plain HTTP: wrk -> front -> nginx proxy -> backend
    front_gateway: int  # plain HTTP: wrk -> front -> gateway -> backend
    proxy: int  # TLS: the nginx reverse proxy standing in for the gateway
    backend: int  # TLS: demands the front-proxy client certificate
    gateway: int


def backend_conf(work: Path, ports: Ports) -> str:
    return f"""
worker_processes 1;
daemon off;
pid {work}/backend.pid;
error_log {work}/backend-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path {work}/backend-body;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {work}/backend.crt;
    ssl_certificate_key {work}/backend.key;
    server {{
        listen 127.0.0.1:{ports.backend} ssl;
        ssl_client_certificate {work}/pki/front-proxy-ca.crt;
        ssl_verify_client on;
        if ($http_x_remote_user = "") {{ return 401; }}
        location / {{
            default_type application/json;
            return 200 '{DOCUMENT}';
        }}
    }}
}}
"""


def _upstream(name: str, port: int) -> str:
    return f"upstream {name} {{ server 127.0.0.1:{port}; keepalive 256; }}"


def front_conf(work: Path, ports: Ports, client: str = "admin") -> str:
    """wrk's side: plain HTTP in, TLS out with the `client` certificate (`pki/<client>.crt`; the admin,
    a system:masters member, by default), pooled connections."""
    tls_out = f"""
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_ssl_certificate {work}/pki/{client}.crt;
        proxy_ssl_certificate_key {work}/pki/{client}.key;
        proxy_ssl_session_reuse on;"""
    direct_out = f"""
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header X-Remote-User admin;
        proxy_ssl_certificate {work}/pki/front-proxy-client.crt;
        proxy_ssl_certificate_key {work}/pki/front-proxy-client.key;
        proxy_ssl_session_reuse on;"""
    return f"""
worker_processes 1;
daemon off;
pid {work}/front.pid;
error_log {work}/front-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {work}/front-body;
    {_upstream("direct", ports.backend)}
    {_upstream("nginxproxy", ports.proxy)}
    {_upstream("gateway", ports.gateway)}
    server {{ listen 127.0.0.1:{ports.front_direct}; location / {{ proxy_pass https://direct; {direct_out} }} }}
    server {{ listen 127.0.0.1:{ports.front_nginx}; location / {{ proxy_pass https://nginxproxy; {tls_out} }} }}
    server {{ listen 127.0.0.1:{ports.front_gateway}; location / {{ proxy_pass https://gateway; {tls_out} }} }}
}}
"""


def proxy_conf(work: Path, ports: Ports) -> str:
    """nginx in the gateway's place: verifies the client certificate, asserts the user, proxies."""
    return f"""
worker_processes 1;
daemon off;
pid {work}/proxy.pid;
error_log {work}/proxy-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {work}/proxy-body;
    {_upstream("backend", ports.backend)}
    server {{
        listen 127.0.0.1:{ports.proxy} ssl;
        ssl_certificate {work}/certs/apiserver.crt;
        ssl_certificate_key {work}/certs/apiserver.key;
        ssl_client_certificate {work}/pki/client-ca.crt;
        ssl_verify_client on;
        location / {{
            proxy_pass https://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Remote-User $ssl_client_s_dn;
            proxy_ssl_certificate {work}/pki/front-proxy-client.crt;
            proxy_ssl_certificate_key {work}/pki/front-proxy-client.key;
            proxy_ssl_session_reuse on;
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(work: Path, name: str, conf: str, cpus: str | None) -> Iterator[subprocess.Popen[bytes]]:
    path = work / f"{name}.conf"
    path.write_text(conf)
    proc = subprocess.Popen([*pinning(cpus), NGINX, "-c", str(path), "-e", str(work / f"{name}-error.log")])
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def worker_pid(master: subprocess.Popen[bytes]) -> int:
    """nginx's one worker process (where the requests are served)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master.pid}/task/{master.pid}/children")
        if children.exists() and (text := children.read_text().split()):
            return int(text[0])
        time.sleep(0.05)
    raise RuntimeError("nginx started no worker")


@dataclass(frozen=True)
class Measured:
    wrk: WrkResult
    cpu_us_per_request: float

    def line(self) -> str:
        return f"{self.wrk.line()}   CPU {self.cpu_us_per_request:>6.0f} µs/request"


def measured(
    label: str, url: str, pid: int, cpus: str | None, *, threads: int, connections: int, seconds: int
) -> Measured:
    before = cpu_seconds(pid)
    result = run_wrk(label, url, cpus=cpus, threads=threads, connections=connections, seconds=seconds)
    spent = cpu_seconds(pid) - before
    requests = result.requests_per_second * seconds
    return Measured(result, spent / requests * 1e6 if requests else 0.0)



def prepare(work: Path) -> tuple[Ports, Path, Path]:
    """Everything a proxied-GET benchmark starts from, in `work`: the gateway's PKI (`pki/`), the
    nginx backend's serving pair (`backend.crt`/`.key`), free ports, and a folder registering the
    backend as the bench group's APIService. Returns (ports, pki folder, manifests folder)."""
    pki = work / "pki"
    init_pki(pki)
    backend_ca = new_ca("bench-backend-ca")
    write_pair(work, "backend", issue_serving_cert(backend_ca, ["backend.bench.svc", "127.0.0.1"]))
    ports = Ports(*(free_port() for _ in range(6)))
    folder = work / "apiservices"
    folder.mkdir()
    (folder / "bench.yaml").write_text(
        yaml.safe_dump_all(registration(GROUP, VERSION, "backend", ports.backend, backend_ca.cert_pem))
    )
    return ports, pki, folder

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gateway-args", default="", help="extra `aggregator serve` flags, space-separated")
    args = parser.parse_args()
    opts = {"seconds": args.seconds, "connections": args.connections, "threads": args.threads}
    cpus = os.cpu_count() or 1
    server_cpu, client_cpus = ("0", f"1-{cpus - 1}") if cpus >= 2 else (None, None)

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        work = Path(tmp)
        ports, pki, folder = prepare(work)
        gateway_args = [
            "--client-ca-file", str(pki / "client-ca.crt"),
            "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
            "--requestheader-allowed-names", "front-proxy-client",
            "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
            *args.gateway_args.split(),
        ]  # fmt: skip
        with (
            gateway_process(folder, work, gateway_args, port=ports.gateway, cpus=server_cpu) as gateway,
            nginx(work, "backend", backend_conf(work, ports), client_cpus),
            nginx(work, "proxy", proxy_conf(work, ports), server_cpu) as proxy,
            nginx(work, "front", front_conf(work, ports), client_cpus),
        ):
            direct = f"http://127.0.0.1:{ports.front_direct}{PATH}"
            via_nginx = f"http://127.0.0.1:{ports.front_nginx}{PATH}"
            via_gateway = f"http://127.0.0.1:{ports.front_gateway}{PATH}"
            for url in (direct, via_nginx, via_gateway):
                wait_for_http(url, DOCUMENT.encode())
            warm = {**opts, "seconds": min(3, args.seconds)}
            for url in (direct, via_nginx, via_gateway):
                run_wrk("warm-up", url, cpus=client_cpus, **warm)
            rss_before = rss_bytes(gateway.pid)
            floor = run_wrk("direct (front -> backend)", direct, cpus=client_cpus, **opts)
            baseline = measured("nginx as the proxy", via_nginx, worker_pid(proxy), client_cpus, **opts)
            ours = measured("gateway", via_gateway, gateway.pid, client_cpus, **opts)
            rss_after = rss_bytes(gateway.pid)
    print(
        f"\nGET {PATH} ({len(DOCUMENT)} bytes) with the admin client certificate over keep-alive TLS, "
        f"{args.connections} connections, {args.seconds}s each, {cpus} CPUs"
        + (f" (proxy on CPU {server_cpu}, wrk and the nginx front and backend on {client_cpus})" if server_cpu else "")
    )
    print(floor.line())
    print(baseline.line())
    print(ours.line())
    print(
        f"gateway: {ours.wrk.requests_per_second / baseline.wrk.requests_per_second:.2f}x nginx's requests/s, "
        f"{ours.cpu_us_per_request / max(baseline.cpu_us_per_request, 1e-9):.1f}x its CPU per request; "
        f"RSS {rss_before / 2**20:.0f} MiB before, {rss_after / 2**20:.0f} MiB after "
        f"{ours.wrk.requests_per_second * args.seconds:.0f} requests"
    )
    errors = floor.errors + baseline.wrk.errors + ours.wrk.errors
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
