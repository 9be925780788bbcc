"""Benchmark: what a dead, slow or hung replica costs clients, this checkout against a baseline.

Run from the repository root:  .venv/bin/python benchmarks/resilience.py [--baseline ../main]

Three replicas of an extension server run as real processes over TLS on 127.0.0.2-4 (one port,
one EndpointSlice) behind `aggregator serve --enable-aggregator-routing` in local mode, and four
clients send GETs with client certificates on keep-alive connections:
- killed: one replica is SIGKILLed after 300 of 1500 GETs; the EndpointSlice is left as it was
  (the worst case: nothing tells the gateway). Figure: the GETs that failed.
- slow: one replica answers 200 ms late; 400 GETs. Figure: its share of them.
- blackhole: one replica, cluster IP, SIGSTOPped (connections accepted, nothing answers), with
  `aggregator.dev/response-header-timeout: 2s`; three GETs at once. Figures: when the APIService
  was reported unavailable, and the slowest answer.
`--baseline` names another checkout (e.g. `git worktree add --detach ../main main`): its gateway
runs the same scenarios in the same run, so the figures compare on one machine under one load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import yaml

from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair
from tests.support.backend import APISERVICE, PREFIX, SERVER_NAME, apiservice_manifest, service_manifest
from tests.support.pki import PKI, make_pki
from tests.support.ports import free_port
from tests.support.replica import Replicas, endpointslice_for
from tests.workers.group import serve_args

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
THINGS = f"{PREFIX}/namespaces/default/things"


class Bench:
    def __init__(self, workdir: Path, src: str | None) -> None:
        self.workdir = workdir
        self.src = src
        self.pki: PKI = make_pki(workdir / "pki")
        ca = new_ca("replica-ca")
        write_pair(workdir, "replica", issue_serving_cert(ca, [SERVER_NAME]))
        self.ca_pem = ca.cert_pem

    async def replicas(self, hosts: tuple[str, ...], delays: dict[str, float] | None = None) -> Replicas:
        replicas = Replicas(
            str(self.workdir / "replica.crt"),
            str(self.workdir / "replica.key"),
            self.pki.path("front-proxy-ca.crt"),
            self.workdir,
            hosts,
            delays=delays or {},
        )
        for host in hosts:
            (self.workdir / f"{host}.log").unlink(missing_ok=True)
        await replicas.start()
        return replicas

    def register(self, folder: Path, replicas: Replicas, *, cluster_ip: str = "127.0.0.1", **annotations: str) -> None:
        svc = apiservice_manifest(port=replicas.port, ca_pem=self.ca_pem)
        if annotations:
            svc["metadata"]["annotations"] = annotations
        docs = [svc, service_manifest(port=replicas.port, cluster_ip=cluster_ip), endpointslice_for(replicas)]
        (folder / "demo.yaml").write_text(yaml.safe_dump_all(docs))

    @contextlib.asynccontextmanager
    async def gateway(self, folder: Path) -> AsyncIterator[str]:
        port = free_port()
        args = serve_args(self.pki, folder, port, "--enable-aggregator-routing", "--workers", "1")
        env = {**os.environ}
        cwd = None
        if self.src:
            cwd = env["PYTHONPATH"] = self.src
        log = (self.workdir / "gateway.log").open("ab")
        process = await asyncio.create_subprocess_exec(*args, stderr=log, env=env, cwd=cwd)
        url = f"https://127.0.0.1:{port}"
        try:
            await self.until(lambda: self.available(url), 30)
            yield url
        finally:
            process.terminate()
            await process.wait()

    async def get(self, url: str, session: aiohttp.ClientSession | None = None) -> tuple[int, bytes]:
        own = session is None
        session = session or aiohttp.ClientSession()
        try:
            async with session.get(url, ssl=self.pki.client_context("admin")) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientError:
            return 0, b""
        finally:
            if own:
                await session.close()

    async def available(self, url: str) -> bool:
        status, body = await self.get(f"{url}/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        return status == 200 and b'"type":"Available","status":"True"' in body

    @staticmethod
    async def until(check: Callable[[], Awaitable[bool]], timeout: float) -> float:
        started = time.monotonic()
        while not await check():
            if time.monotonic() - started > timeout:
                raise TimeoutError("timed out")
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def steady(
        self, url: str, total: int, at: int | None = None, then: Callable[[], Awaitable[None]] | None = None
    ) -> list[int]:
        statuses: list[int] = []
        sent = 0
        reached = asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def client() -> None:
                nonlocal sent
                while sent < total:
                    sent += 1
                    statuses.append((await self.get(url + THINGS, session))[0])
                    if at is not None and len(statuses) >= at:
                        reached.set()

            async def trigger() -> None:
                await reached.wait()
                assert then is not None  # trigger() runs only with a `then`
                await then()

            await asyncio.gather(*(client() for _ in range(4)), *([trigger()] if then else []))
        return statuses

    # --- scenarios -------------------------------------------------------------------------------------

    async def killed(self) -> str:
        folder = self.fresh("killed")
        replicas = await self.replicas(HOSTS)
        try:
            self.register(folder, replicas)
            async with self.gateway(folder) as url:
                statuses = await self.steady(url, 1500, at=300, then=lambda: replicas.kill(HOSTS[1]))
        finally:
            await replicas.close()
        failed = sum(1 for s in statuses if s != 200)
        return f"{failed} of {len(statuses)} GETs failed ({100 * failed / len(statuses):.2f}%)"

    async def slow(self) -> str:
        folder = self.fresh("slow")
        replicas = await self.replicas(HOSTS, {HOSTS[0]: 0.2})
        try:
            self.register(folder, replicas)
            async with self.gateway(folder) as url:
                statuses = await self.steady(url, 400)
            share = replicas[HOSTS[0]].received(THINGS) / len(statuses)
        finally:
            await replicas.close()
        return f"the slow replica got {100 * share:.1f}% of the GETs"

    async def blackhole(self) -> str:
        folder = self.fresh("blackhole")
        replicas = await self.replicas(HOSTS[:1])
        try:
            # A baseline without the annotation ignores it; this checkout answers within it.
            self.register(folder, replicas, cluster_ip=HOSTS[0], **{"aggregator.dev/response-header-timeout": "2s"})
            async with self.gateway(folder) as url:
                replicas.stop(HOSTS[0])
                stopped = time.monotonic()

                async def one() -> float:
                    await self.get(url + THINGS)
                    return time.monotonic() - stopped

                gets = asyncio.gather(one(), one(), one())
                unavailable = await self.until(lambda: self.not_available(url), 60)
                slowest = max(await gets)
        finally:
            await replicas.close()
        return f"unavailable after {unavailable:.1f}s; the slowest of 3 GETs answered after {slowest:.1f}s"

    async def not_available(self, url: str) -> bool:
        return not await self.available(url)

    def fresh(self, name: str) -> Path:
        folder = self.workdir / f"{name}-apiservices"
        folder.mkdir(exist_ok=True)
        return folder


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another checkout whose gateway runs the same scenarios")
    parser.add_argument("--scenarios", default="killed,slow,blackhole", help="comma-separated")
    options = parser.parse_args()
    runs: list[tuple[str, str | None]] = [("this checkout", None)]
    if options.baseline:
        runs.insert(0, ("baseline", str(Path(options.baseline).resolve())))
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in options.scenarios.split(","):
            for label, src in runs:
                workdir = Path(tmp) / f"{label.replace(' ', '-')}-{scenario}"
                workdir.mkdir()
                figure = await getattr(Bench(workdir, src), scenario)()
                print(f"{scenario:10} {label:14} {figure}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
