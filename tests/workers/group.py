"""`aggregator serve --workers N` as a user starts it: a subprocess in local mode, and a client
that opens a fresh connection per request (so the kernel may hand each to another worker)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.pki import PKI
from tests.support.polling import until_async as until_async  # also imported from here by tests
from tests.support.ports import free_port

PID_NOTE = re.compile(r"info: worker (\d+) of (\d+), pid (\d+)")


@dataclass
class Group:
    process: asyncio.subprocess.Process
    port: int
    pki: PKI
    log_path: Path
    session: aiohttp.ClientSession
    seen: list[int] = field(default_factory=list)  # worker pids that answered, in order

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def context(self, cert: str | None = "admin") -> ssl.SSLContext:
        return self.pki.client_context(cert)

    async def get(self, path: str, *, cert: str | None = "admin", **kwargs: Any) -> tuple[int, bytes]:
        """One request on a fresh connection."""
        async with self.session.get(self.url + path, ssl=self.context(cert), **kwargs) as resp:
            return resp.status, await resp.read()

    async def worker_pid(self) -> int:
        """Which worker answers a fresh connection (its note in `/livez?verbose`)."""
        status, body = await self.get("/livez?verbose")
        assert status == 200, body
        match = PID_NOTE.search(body.decode())
        assert match is not None, body
        pid = int(match.group(3))
        self.seen.append(pid)
        return pid

    def log(self) -> str:
        return self.log_path.read_text()

    @contextlib.asynccontextmanager
    async def each_worker(self, count: int) -> AsyncIterator[dict[int, WorkerConnection]]:
        """One keep-alive connection to each of `count` workers, by index (the kernel spreads
        new connections, so connections are opened until every worker has answered one)."""
        found: dict[int, WorkerConnection] = {}
        try:
            for _ in range(200):
                connection = WorkerConnection(self)
                index = await connection.worker()
                if index in found:
                    await connection.close()
                else:
                    found[index] = connection
                if len(found) == count:
                    break
            assert len(found) == count, f"only workers {sorted(found)} answered"
            yield found
        finally:
            for connection in found.values():
                await connection.close()


class WorkerConnection:
    """One keep-alive connection to the group, so every request lands on the same worker."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.session.get(self.group.url + path, ssl=self.group.context()) as resp:
            return resp.status, await resp.read()

    async def worker(self) -> int:
        status, body = await self.get("/livez?verbose")
        match = PID_NOTE.search(body.decode())
        assert status == 200 and match is not None, body
        return int(match.group(1))

    async def close(self) -> None:
        await self.session.close()


def serve_args(pki: PKI, apiservices_dir: Path | None, port: int, *extra: str) -> list[str]:
    """Local mode in `apiservices_dir`; None: kube mode (`extra` names the kubeconfig)."""
    return [
        sys.executable,
        "-m",
        "aggregator",
        "serve",
        *(["--apiservices-dir", str(apiservices_dir)] if apiservices_dir is not None else []),
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
        "--tls-cert-file",
        pki.path("serving.crt"),
        "--tls-private-key-file",
        pki.path("serving.key"),
        "--client-ca-file",
        pki.path("client-ca.crt"),
        "--requestheader-client-ca-file",
        pki.path("front-proxy-ca.crt"),
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--proxy-client-cert-file",
        pki.path("front-proxy-client.crt"),
        "--proxy-client-key-file",
        pki.path("front-proxy-client.key"),
        *extra,
    ]


@contextlib.asynccontextmanager
async def running_group(
    pki: PKI, apiservices_dir: Path | None, log_path: Path, *extra: str, serving: tuple[str, str] | None = None
) -> AsyncIterator[Group]:
    """The gateway in local mode as a subprocess, ready (`/readyz` 200); SIGTERM and exit 0 on the way out."""
    port = free_port()
    args = serve_args(pki, apiservices_dir, port, *extra)
    if serving is not None:
        args[args.index("--tls-cert-file") + 1] = serving[0]
        args[args.index("--tls-private-key-file") + 1] = serving[1]
    async with running_serve(pki, args, port, log_path) as group:
        yield group


@contextlib.asynccontextmanager
async def running_serve(pki: PKI, args: list[str], port: int, log_path: Path) -> AsyncIterator[Group]:
    """`args` (an `aggregator serve` command listening on `port`) as a subprocess, ready."""
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(*args, stderr=log_file)
    connector = aiohttp.TCPConnector(force_close=True)
    session = aiohttp.ClientSession(connector=connector)
    group = Group(process, port, pki, log_path, session)

    async def ready() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"the gateway exited ({process.returncode}): {group.log()}")
        try:
            status, _ = await group.get("/readyz")
        except (aiohttp.ClientError, OSError):
            return False
        return status == 200

    try:
        try:  # a loaded 2-core machine starts the four interpreters of `--workers 2` slowly
            await until_async(ready, 60.0, "the gateway to be ready")
        except AssertionError as err:
            raise AssertionError(f"{err}:\n{group.log()}") from None
        yield group
    finally:
        await session.close()
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
