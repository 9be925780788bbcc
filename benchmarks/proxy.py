"""Benchmark: the same GET straight to a TLS backend and through the gateway's proxy, with wrk.

Run from the repository root:  .venv/bin/python benchmarks/proxy.py [--seconds 10] [--connections 32]

The backend is nginx with two TLS listeners serving the same JSON document: one for wrk directly
(the baseline), one that demands a client certificate signed by the front-proxy CA and an
`X-Remote-User` header, which only the gateway can satisfy. The gateway runs as `aggregator serve`
in local mode with `--anonymous-auth` (wrk cannot present a client certificate) and proxies the
registered APIService to the second listener. Both runs use the same wrk settings, one after the
other, after a warm-up; the script prints requests/s and p50/p99 for each, the throughput ratio,
and the p50 the proxy adds per request. On a small machine wrk, nginx and the gateway share the
cores: treat the figures as a ratio, not a capacity.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from wrkbench import WrkResult, fetch, free_port, gateway_process, run_wrk

from aggregator.commands.certs import init_pki, issue_serving_cert, new_ca, write_pair

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


def nginx_conf(work: Path, direct_port: int, backend_port: int) -> str:
    location = f"""
        location / {{
            default_type application/json;
            return 200 '{DOCUMENT}';
        }}"""
    return f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path {work}/nginx-body;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {work}/backend.crt;
    ssl_certificate_key {work}/backend.key;
    server {{
        listen 127.0.0.1:{direct_port} ssl;
        {location}
    }}
    server {{
        listen 127.0.0.1:{backend_port} ssl;
        ssl_client_certificate {work}/pki/front-proxy-ca.crt;
        ssl_verify_client on;
        if ($http_x_remote_user = "") {{ return 401; }}
        {location}
    }}
}}
"""


@contextlib.contextmanager
def nginx(work: Path, direct_port: int, backend_port: int) -> Iterator[None]:
    conf = work / "nginx.conf"
    conf.write_text(nginx_conf(work, direct_port, backend_port))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-e", str(work / "nginx-error.log")])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if fetch(f"https://127.0.0.1:{direct_port}/")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start; see {work / 'nginx-error.log'}")
            time.sleep(0.05)
        yield
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def registration(backend_port: int, ca_pem: bytes) -> list[dict[str, object]]:
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "service": {"namespace": "bench", "name": "backend", "port": backend_port},
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": "bench", "name": "backend"},
            "spec": {"clusterIP": "127.0.0.1", "ports": [{"name": "https", "port": backend_port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": "bench",
                "name": "backend-1",
                "labels": {"kubernetes.io/service-name": "backend"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": backend_port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        },
    ]


def wait_proxied(url: str, timeout: float = 30.0) -> None:
    """Until the APIService is available and the proxied GET returns the document."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, _headers, body = fetch(url)
            if status == 200 and body == DOCUMENT.encode():
                return
            last = status
        except OSError as err:
            last = err
        time.sleep(0.2)
    raise RuntimeError(f"the proxied GET never succeeded (last: {last})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    opts = {"seconds": args.seconds, "connections": args.connections, "threads": args.threads}

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        work = Path(tmp)
        init_pki(work / "pki")
        backend_ca = new_ca("bench-backend-ca")
        write_pair(work, "backend", issue_serving_cert(backend_ca, ["backend.bench.svc", "127.0.0.1"]))
        direct_port, backend_port = free_port(), free_port()
        folder = work / "apiservices"
        folder.mkdir()
        (folder / "bench.yaml").write_text(
            yaml.safe_dump_all(registration(backend_port, backend_ca.cert_pem))
        )
        gateway_args = [
            "--proxy-client-cert-file", str(work / "pki" / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(work / "pki" / "front-proxy-client.key"),
        ]  # fmt: skip
        with nginx(work, direct_port, backend_port), gateway_process(folder, work, gateway_args) as url:
            direct = f"https://127.0.0.1:{direct_port}{PATH}"
            proxied = url + PATH
            wait_proxied(proxied)
            # nginx refuses anyone but the gateway on the backend listener.
            try:
                refused = fetch(f"https://127.0.0.1:{backend_port}{PATH}")[0]
            except OSError:
                refused = 400
            assert refused != 200, "the backend listener must demand the front-proxy certificate"
            warm = {**opts, "seconds": min(3, args.seconds)}
            run_wrk("warm-up direct", direct, **warm)
            run_wrk("warm-up proxied", proxied, **warm)
            # One connection: the latency the proxy adds to a lone request. Then under load.
            single = {**opts, "connections": 1, "threads": 1}
            unloaded = [
                run_wrk("direct, 1 connection", direct, **single),
                run_wrk("gateway, 1 connection", proxied, **single),
            ]
            results: list[WrkResult] = [
                run_wrk(f"direct, {args.connections} connections", direct, **opts),
                run_wrk(f"gateway, {args.connections} connections", proxied, **opts),
            ]
    base, gw = results
    print(
        f"\nGET {PATH} ({len(DOCUMENT)} bytes), {args.connections} connections, {args.threads} wrk threads, "
        f"{args.seconds}s each, {os.cpu_count()} CPUs shared by wrk, nginx and the gateway"
    )
    for result in [*unloaded, *results]:
        print(result.line())
    print(
        f"unloaded: p50 overhead {unloaded[1].p50_ms - unloaded[0].p50_ms:.2f} ms per request "
        f"({unloaded[0].p50_ms:.2f} ms direct, {unloaded[1].p50_ms:.2f} ms through the gateway)"
    )
    print(
        f"under load: the gateway serves {gw.requests_per_second / base.requests_per_second:.2f}x the direct "
        f"throughput; p50 overhead {gw.p50_ms - base.p50_ms:.2f} ms per request, p99 overhead "
        f"{gw.p99_ms - base.p99_ms:.2f} ms"
    )
    return 0 if all(r.errors == 0 for r in [*unloaded, *results]) else 1


if __name__ == "__main__":
    sys.exit(main())
