"""`aggregator serve` as a user runs it: a subprocess on a real port, ready when `/readyz` says so.

    async with serving(args, port, ca_file, log_path) as served:
        status, body = await served.get("/apis", ssl=context)

The process is what ships (`python -m aggregator serve ...`, with `--workers N` the supervisor, its
control process and N fresh worker interpreters), so nothing the test reaches is in-process.
On the way out it gets SIGTERM, and the exit code is kept (`served.returncode`) for tests of
shutdown; a process that does not stop within 30 s is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.polling import until_async

PID_NOTE = re.compile(r"info: worker (\d+) of (\d+), pid (\d+)")
SERVE = (sys.executable, "-m", "aggregator", "serve")


@dataclass
class Served:
    process: asyncio.subprocess.Process
    port: int
    ca_file: str
    log_path: Path
    session: aiohttp.ClientSession
    returncode: int | None = None
    seen: list[int] = field(default_factory=list)  # worker pids that answered, in order

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def context(self, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
        """Trusts the serving CA; presents `cert` (certificate file, key file) when given."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx

    async def get(
        self, path: str, *, cert: tuple[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One GET on a fresh connection (so the kernel may hand it to any worker)."""
        async with self.session.get(self.url + path, ssl=self.context(cert), headers=headers or {}) as resp:
            return resp.status, await resp.read()

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        cert = kwargs.pop("cert", None)
        async with self.session.request(method, self.url + path, ssl=self.context(cert), **kwargs) as resp:
            return resp.status, await resp.read()

    async def worker_pid(self) -> int | None:
        """Which worker answered a fresh connection (its note in `/livez?verbose`); None: one process."""
        status, body = await self.get("/livez?verbose")
        assert status == 200, body
        match = PID_NOTE.search(body.decode())
        if match is None:
            return None
        pid = int(match.group(3))
        self.seen.append(pid)
        return pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the process and wait for its exit code (killed after `timeout` seconds)."""
        process = self.process
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
            try:
                async with asyncio.timeout(timeout):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        self.returncode = process.returncode
        assert self.returncode is not None
        return self.returncode


@contextlib.asynccontextmanager
async def serving(
    args: Sequence[str], port: int, ca_file: str, log_path: Path, *, ready_timeout: float = 120.0
) -> AsyncIterator[Served]:
    """Run `aggregator serve <args>` (listening on `port`) until the block ends; ready on entry."""
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(*SERVE, *args, stderr=log_file)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    served = Served(process, port, ca_file, log_path, session)

    async def ready() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"the gateway exited ({process.returncode}):\n{served.log()}")
        try:
            status, _ = await served.get("/readyz")
        except (aiohttp.ClientError, OSError):
            return False
        return status == 200

    try:
        try:
            await until_async(ready, ready_timeout, "the gateway to be ready")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{served.log()}") from None
        yield served
    finally:
        await session.close()
        await served.stop()
