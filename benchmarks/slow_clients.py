"""Benchmark: 2,000 slow clients (slowloris) against a normal one, and the header timeout closing them.

Run from the repository root:  .venv/bin/python benchmarks/slow_clients.py [--slow 2000] [--rounds 200]

The gateway runs as its own process (`aggregator serve`, production timeouts: a request head must
arrive within 32 s, kube-apiserver's ReadHeaderTimeout). A normal client times `GET /livez` on one
keep-alive connection and on fresh connections (TLS handshake included), first alone, then while
`--slow` connections each hold a request head that never ends. Then the slow connections wait:
the gateway must close every one of them about 32 s after it was opened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from wrkbench import gateway_process

PARTIAL_HEAD = b"GET /livez HTTP/1.1\r\nHost: gateway\r\nUser-Agent: slow"


def insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{label:<44} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   n={len(ms)}"


async def normal_client(url: str, rounds: int) -> tuple[list[float], list[float]]:
    """(keep-alive request times, fresh-connection request times)."""
    ctx = insecure()
    kept: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            started = time.monotonic()
            async with session.get(url + "/livez", ssl=ctx) as resp:
                await resp.read()
            kept.append(time.monotonic() - started)
    fresh: list[float] = []
    for _ in range(max(10, rounds // 10)):
        started = time.monotonic()
        async with aiohttp.ClientSession() as session, session.get(url + "/livez", ssl=ctx) as resp:
            await resp.read()
        fresh.append(time.monotonic() - started)
    return kept, fresh


Slow = tuple[float, asyncio.StreamReader, asyncio.StreamWriter]


async def open_slow(host: str, port: int, count: int) -> list[Slow]:
    """`count` connections, each with a request head that never ends (writers kept: a collected
    StreamWriter closes its connection)."""
    ctx = insecure()
    gate = asyncio.Semaphore(64)
    opened: list[Slow] = []

    async def one() -> None:
        async with gate:
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            writer.write(PARTIAL_HEAD)
            opened.append((time.monotonic(), reader, writer))

    await asyncio.gather(*(one() for _ in range(count)))
    return opened


async def closed_after(opened_at: float, reader: asyncio.StreamReader, limit: float) -> float | None:
    try:
        async with asyncio.timeout(limit):
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
    except TimeoutError:
        return None
    return time.monotonic() - opened_at


async def run(url: str, slow: int, rounds: int) -> None:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    kept, fresh = await normal_client(url, rounds)
    print(summary("alone: keep-alive GET /livez", kept))
    print(summary("alone: new connection + GET /livez", fresh))
    started = time.monotonic()
    opened = await open_slow(host, int(port), slow)
    print(f"{slow} slow connections opened in {time.monotonic() - started:.1f} s")
    kept_loaded, fresh_loaded = await normal_client(url, rounds)
    print(summary(f"with {slow} slow: keep-alive GET /livez", kept_loaded))
    print(summary(f"with {slow} slow: new connection + GET /livez", fresh_loaded))
    ratio = statistics.median(kept_loaded) / statistics.median(kept)
    print(f"keep-alive p50 ratio loaded/alone: {ratio:.2f}x")
    closes = await asyncio.gather(*(closed_after(at, reader, 60.0) for at, reader, _ in opened))
    done = sorted(c for c in closes if c is not None)
    print(
        f"closed by the gateway: {len(done)} of {slow}"
        + (
            f"; after {done[0]:.1f} s (first), {statistics.median(done):.1f} s (median), {done[-1]:.1f} s (last)"
            if done
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        objects = workdir / "apiservices"
        objects.mkdir()
        with gateway_process(objects, workdir) as gateway:
            asyncio.run(run(gateway.url, args.slow, args.rounds))


if __name__ == "__main__":
    main()
