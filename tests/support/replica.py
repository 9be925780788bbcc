"""Replicas of an extension API server as real processes over TLS, each on its own 127.0.0.x.

`python -m tests.support.replica --host 127.0.0.2 --port P ...` serves the demo group-version's
discovery and answers every other path with a small list naming the host; it demands a client
certificate from the front-proxy CA, optionally answers `--delay` seconds late, and appends one
line per request (`METHOD path`) to `--log`, so a test can tell what each replica received. It
prints `ready` once it listens.

`Replicas` starts several on one port (an EndpointSlice has one port for all its endpoints) and
does to them what happens to real ones: SIGKILL, SIGSTOP (a blackhole: the kernel still accepts
connections, nobody answers), SIGCONT, a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.support.backend import GROUP, PREFIX, VERSION
from tests.support.ports import free_port

DISCOVERY = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": f"{GROUP}/{VERSION}",
    "resources": [
        {
            "name": "things",
            "singularName": "thing",
            "namespaced": True,
            "kind": "Thing",
            "verbs": ["get", "list"],
        }
    ],
}


def _serve(args: argparse.Namespace) -> None:
    log = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    async def handle(request: web.Request) -> web.StreamResponse:
        log.write(f"{request.method} {request.path}\n")
        if request.path == PREFIX:
            return web.json_response(DISCOVERY)
        if args.delay:
            await asyncio.sleep(args.delay)  # a slow replica, as the test asked
        body = {
            "kind": "ThingList",
            "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {},
            "items": [],
            "host": args.host,
        }
        return web.json_response(body)

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(args.client_ca)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, ssl_context=context, reuse_address=True)
        await site.start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


@dataclass
class Replica:
    host: str
    log: Path
    delay: float = 0.0
    process: asyncio.subprocess.Process | None = None

    def received(self, path: str | None = None) -> int:
        """Requests this replica received (for `path` only, when given), over every life of it."""
        if not self.log.exists():
            return 0
        lines = self.log.read_text().splitlines()
        return sum(1 for line in lines if path is None or line.split(" ", 1)[1] == path)


@dataclass
class Replicas:
    """Replica processes of one Service, all on `port` (see the module docstring)."""

    cert: str
    key: str
    client_ca: str
    directory: Path
    hosts: Sequence[str]
    port: int = 0
    delays: dict[str, float] = field(default_factory=dict)
    replicas: dict[str, Replica] = field(default_factory=dict)

    async def start(self) -> None:
        if not self.port:
            self.port = _port_free_on(self.hosts)
        for host in self.hosts:
            self.replicas[host] = Replica(host, self.directory / f"{host}.log", self.delays.get(host, 0.0))
            await self.start_one(host)

    async def start_one(self, host: str) -> None:
        replica = self.replicas[host]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.replica",
            "--host",
            host,
            "--port",
            str(self.port),
            "--cert",
            self.cert,
            "--key",
            self.key,
            "--client-ca",
            self.client_ca,
            "--log",
            str(replica.log),
            "--delay",
            str(replica.delay),
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line.strip() == b"ready", f"replica {host} did not start: {line!r}"
        replica.process = process

    def __getitem__(self, host: str) -> Replica:
        return self.replicas[host]

    async def kill(self, host: str) -> None:
        """SIGKILL, and wait until the kernel has closed its sockets."""
        process = self.replicas[host].process
        assert process is not None
        process.kill()
        await process.wait()

    def stop(self, host: str) -> None:
        """SIGSTOP: connections are still accepted (the kernel's backlog), nothing answers."""
        process = self.replicas[host].process
        assert process is not None
        process.send_signal(signal.SIGSTOP)

    def resume(self, host: str) -> None:
        process = self.replicas[host].process
        assert process is not None
        process.send_signal(signal.SIGCONT)

    async def close(self) -> None:
        for replica in self.replicas.values():
            process = replica.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                await process.wait()


def _port_free_on(hosts: Sequence[str]) -> int:
    """A port free on every one of `hosts` right now."""
    return free_port(hosts)


def endpointslice_for(replicas: Replicas, ready: dict[str, bool] | None = None) -> dict[str, object]:
    from tests.support.backend import endpointslice_manifest

    ready = ready or {}
    return endpointslice_manifest(
        "api-1", [(host, ready.get(host, True)) for host in replicas.hosts], port=replicas.port
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
