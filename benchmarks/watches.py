"""Benchmark: thousands of open watches through one APIService, and a plain GET beside them.

Run from the repository root:  .venv/bin/python benchmarks/watches.py [--watches 1500] [--gets 50]

An extension API server with one APIService answers GETs at once and holds every watch open
(one ADDED event, then a BOOKMARK every 10 s, as an idle watch does). The gateway runs as its own
process (`aggregator serve`, local mode, a client CA and the front-proxy CA configured as kube mode
always is); the client presents the admin client certificate.

First a baseline: `--gets` GETs of one object, each on a fresh TLS connection, with no watch open.
Then `--watches` watches are opened, each waiting for its first event (so each is a live stream
through the gateway to the backend), and the same GETs are timed again beside them. Printed: how
long opening the watches took, GET p50/max with and without them (and the ratio), the gateway's
connections to the backend, its RSS before and after, and whether every watch was still open at
the end. Upstream's Go transport has no per-host connection limit; neither does the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import yaml
from wrkbench import free_port, gateway_process, registration, rss_bytes

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair

GROUP, VERSION = "watch.example.com", "v1"
PREFIX = f"/apis/{GROUP}/{VERSION}"
THINGS = f"{PREFIX}/namespaces/default/things"

# The extension server: discovery for the availability check, one object, watches held open.
BACKEND = textwrap.dedent(
    """
    import asyncio, json, ssl, sys
    from aiohttp import web

    GROUP, VERSION = sys.argv[3], sys.argv[4]
    THING = {"kind": "Thing", "apiVersion": f"{GROUP}/{VERSION}",
             "metadata": {"name": "thing-1", "namespace": "default", "resourceVersion": "1"}}
    RESOURCES = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
                 "resources": [{"name": "things", "singularName": "thing", "namespaced": True,
                                "kind": "Thing", "verbs": ["get", "list", "watch"]}]}

    async def resources(_request):
        return web.json_response(RESOURCES)

    async def things(request):
        if request.query.get("watch") not in ("1", "true"):
            return web.json_response({"kind": "ThingList", "apiVersion": f"{GROUP}/{VERSION}",
                                      "metadata": {"resourceVersion": "1"}, "items": [THING]})
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await out.write(json.dumps({"type": "ADDED", "object": THING}).encode() + b"\\n")
        try:
            while True:
                await asyncio.sleep(10)
                await out.write(b'{"type":"BOOKMARK","object":{"kind":"Thing","metadata":{"resourceVersion":"1"}}}\\n')
        except ConnectionError:  # the watcher went away
            return out

    async def thing(_request):
        return web.json_response(THING)

    app = web.Application()
    app.router.add_get(f"/apis/{GROUP}/{VERSION}", resources)
    app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/default/things", things)
    app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/default/things/thing-1", thing)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(sys.argv[2] + "/backend.crt", sys.argv[2] + "/backend.key")
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), ssl_context=ctx, print=None,
                access_log=None, backlog=4096)
    """
)


def client_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return ctx


async def timed_gets(base: str, ctx: ssl.SSLContext, count: int) -> list[float]:
    """`count` GETs of one object, each on a new connection (a new kubectl run)."""
    took: list[float] = []
    for _ in range(count):
        started = time.monotonic()
        connector = aiohttp.TCPConnector(ssl=ctx, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session, session.get(base + THINGS + "/thing-1") as resp:
            body = await resp.read()
            if resp.status != 200 or json.loads(body)["metadata"]["name"] != "thing-1":
                raise RuntimeError(f"GET answered {resp.status}: {body[:200]!r}")
        took.append(time.monotonic() - started)
    return took


async def open_watch(session: aiohttp.ClientSession, base: str) -> aiohttp.ClientResponse:
    resp = await session.get(base + THINGS + "?watch=true", timeout=aiohttp.ClientTimeout(total=None))
    if resp.status != 200:
        raise RuntimeError(f"a watch answered {resp.status}: {(await resp.read())[:200]!r}")
    first = json.loads(await asyncio.wait_for(resp.content.readline(), 60))
    if first["type"] != "ADDED":
        raise RuntimeError(f"a watch began with {first}")
    return resp


def backend_connections(pid: int, backend_port: int) -> int:
    """The gateway's established TCP connections to the backend's port (from /proc/<pid>/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
        if remote_port == backend_port and state == "01" and inode in inodes:
            count += 1
    return count


def ms(values: list[float], q: float) -> str:
    """The nearest-rank percentile `q` (100: the maximum), in milliseconds."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return f"{ordered[int(rank) - 1] * 1000:.1f} ms"


async def measure(base: str, pid: int, pki: Path, backend_port: int, watches: int, gets: int) -> None:
    ctx = client_context(pki)
    deadline = time.monotonic() + 30
    while True:  # until the first availability check has passed
        try:
            await timed_gets(base, ctx, 5)  # also the warm-up
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    alone = await timed_gets(base, ctx, gets)
    rss_before = rss_bytes(pid)
    connector = aiohttp.TCPConnector(ssl=ctx, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        open_streams: list[aiohttp.ClientResponse] = []
        for batch in range(0, watches, 100):
            open_streams += await asyncio.gather(
                *(open_watch(session, base) for _ in range(min(100, watches - batch)))
            )
        opened = time.monotonic() - started
        beside = await timed_gets(base, ctx, gets)
        upstream = backend_connections(pid, backend_port)
        rss_after = rss_bytes(pid)
        still_open = sum(1 for r in open_streams if not r.content.at_eof() and not r.closed)
        for resp in open_streams:
            resp.close()
    print(f"watches open:            {watches} in {opened:.1f} s ({still_open} still open at the end)")
    print(f"gateway -> backend:      {upstream} connections")
    print(f"GET alone:               p50 {ms(alone, 50)}, p99 {ms(alone, 99)}, max {ms(alone, 100)}")
    print(f"GET beside the watches:  p50 {ms(beside, 50)}, p99 {ms(beside, 99)}, max {ms(beside, 100)}")
    print(f"ratio (beside / alone):  p50 {statistics.median(beside) / statistics.median(alone):.2f}x")
    print(f"gateway RSS:             {rss_before / 2**20:.0f} MiB -> {rss_after / 2**20:.0f} MiB "
          f"({(rss_after - rss_before) / watches / 1024:.1f} KiB per watch)")  # fmt: skip
    verdict = "met" if max(beside) <= 2.0 and still_open == watches else "MISSED"
    print(f"target (every GET <= 2 s beside {watches} watches, all watches open): {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watches", type=int, default=1500)
    parser.add_argument("--gets", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-watches-") as tmp:
        work = Path(tmp)
        pki = work / "pki"
        init_pki(pki)
        ca = new_ca("bench-backend-ca")
        write_pair(work, "backend", issue_serving_cert(ca, ["watcher.bench.svc", "127.0.0.1"]))
        backend_port = free_port()
        folder = work / "apiservices"
        folder.mkdir()
        (folder / "watcher.yaml").write_text(yaml.safe_dump_all(registration(GROUP, VERSION, "watcher", backend_port, ca.cert_pem)))
        (work / "backend.py").write_text(BACKEND)
        backend = subprocess.Popen(
            [sys.executable, str(work / "backend.py"), str(backend_port), str(work), GROUP, VERSION]
        )
        try:
            flags = [
                "--client-ca-file", str(pki / "client-ca.crt"),
                "--requestheader-client-ca-file", str(pki / "front-proxy-ca.crt"),
                "--requestheader-allowed-names", "front-proxy-client",
                "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
                "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
            ]  # fmt: skip
            with gateway_process(folder, work, flags) as gateway:
                try:
                    asyncio.run(measure(gateway.url, gateway.pid, pki, backend_port, args.watches, args.gets))
                except RuntimeError:
                    print("".join(line for line in (work / "gateway.log").read_text().splitlines(True) if "aggregator.access" not in line)[-3000:], file=sys.stderr)
                    raise
        finally:
            backend.terminate()
            backend.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
