"""A 50 MiB response through a gateway process must not grow that process's memory.

The gateway runs as `aggregator serve` in a subprocess so its resident set size is its own; the
fake backend and the client run in the test process. Halfway through, the client stops reading
for a while: a proxy that buffered instead of applying backpressure would pull the rest of the
body into memory during that pause.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.support.backend import (
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    write_manifests,
)
from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.support.ports import free_port
from tests.workers.group import serve_args

SIZE = 50 * 1024 * 1024
BLOCK = 256 * 1024
ALLOWED_GROWTH = 8 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class PeakSampler:
    """Samples a process's RSS every 10 ms in a thread (the event loop is busy streaming)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.01)  # the sampling period

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def gateway_process(pki: PKI, apiservices_dir: Path, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Yields (pid, port) of `aggregator serve` in local mode; manifests must be written first."""
    port = free_port()
    log = (tmp_path / "gateway.log").open("w")
    proc = subprocess.Popen(
        serve_args(pki, apiservices_dir, port),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc.pid, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def test_50_mib_response_does_not_grow_the_gateway(
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    gateway_process: tuple[int, int],
) -> None:
    big = f"{PREFIX}/namespaces/default/things/big"

    async def stream(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        out.content_length = SIZE if request.query.get("size") != "small" else BLOCK
        await out.prepare(request)
        block = b"\xab" * BLOCK
        for _ in range(out.content_length // BLOCK):
            await out.write(block)
        await out.write_eof()
        return out

    backend.routes[big] = stream
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    pid, port = gateway_process
    url = f"https://127.0.0.1:{port}{big}"
    ctx = pki.client_context()
    async with aiohttp.ClientSession() as session:

        async def warmed_up() -> bool:  # ready, and the warm-up request makes the backend's context and pool
            try:
                async with session.get(url + "?size=small", ssl=ctx) as resp:
                    return resp.status == 200 and len(await resp.read()) == BLOCK
            except aiohttp.ClientError:
                return False

        await until_async(warmed_up, 120, "the gateway to come up", every=0.1)  # 3 processes start
        await asyncio.sleep(0.3)  # the warm-up's buffers freed before the baseline is read
        baseline = rss_bytes(pid)
        received = 0
        with PeakSampler(pid) as sampler:
            async with session.get(url, ssl=ctx) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Length"] == str(SIZE)
                paused = False
                async for chunk in resp.content.iter_chunked(BLOCK):
                    received += len(chunk)
                    if not paused and received >= SIZE // 4:
                        paused = True
                        await asyncio.sleep(1.0)  # the client stops reading; the gateway must too
    assert received == SIZE
    growth = sampler.peak - baseline
    assert growth < ALLOWED_GROWTH, f"gateway RSS grew by {growth / 2**20:.1f} MiB"
