"""`aggregator demo`: the whole path in one command, with nothing but this checkout.

Creates the PKI in `certs/` (once), a serving certificate for the sample server valid for
`api.wardle.svc` (the name the gateway verifies), two users (admin in system:masters, and alice
with no rights), the APIService/Service/EndpointSlice manifests that register the sample, then
starts the sample extension API server and the gateway in local mode as child processes, prints
what to try, and stops both cleanly on Ctrl-C (or when either of them dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from aggregator.commands.certs import (
    init_pki,
    issue_client_cert,
    issue_serving_cert,
    kubeconfig,
    load_pair,
    write_kubeconfig,
    write_pair,
)

WARDLE_SERVER_NAME = "api.wardle.svc"
READY_TIMEOUT = 30.0


@dataclass(frozen=True)
class DemoLayout:
    """Where the demo keeps its files, all under one (git-ignored) folder."""

    certs: Path

    @property
    def apiservices(self) -> Path:
        return self.certs / "demo" / "apiservices"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.certs / "demo.kubeconfig"

    @property
    def alice_kubeconfig(self) -> Path:
        return self.certs / "alice.kubeconfig"

    def path(self, name: str) -> str:
        return str(self.certs / name)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def prepare(layout: DemoLayout, *, gateway_port: int, sample_port: int, host: str = "127.0.0.1") -> None:
    """Everything on disk the two servers and the printed commands need. Idempotent."""
    init_pki(layout.certs, server=f"https://{host}:{gateway_port}")
    certs = layout.certs
    if not (certs / "wardle-serving.crt").exists():
        serving = issue_serving_cert(load_pair(certs, "ca"), [WARDLE_SERVER_NAME, "localhost", host])
        write_pair(certs, "wardle-serving", serving)
    if not (certs / "alice.crt").exists():
        write_pair(
            certs, "alice", issue_client_cert(load_pair(certs, "client-ca"), "alice", ["wardle-viewers"])
        )
    ca_pem = (certs / "ca.crt").read_bytes()
    server = f"https://{host}:{gateway_port}"
    write_kubeconfig(
        layout.admin_kubeconfig, kubeconfig(server, ca_pem, load_pair(certs, "admin"), user="admin")
    )
    write_kubeconfig(
        layout.alice_kubeconfig, kubeconfig(server, ca_pem, load_pair(certs, "alice"), user="alice")
    )

    from aggregator.sample.registration import local_manifests

    layout.apiservices.mkdir(parents=True, exist_ok=True)
    for stale in layout.apiservices.glob("*.yaml"):
        stale.unlink()
    manifests = local_manifests(ca_pem, sample_port, address=host)
    (layout.apiservices / "wardle.yaml").write_text(yaml.safe_dump_all(manifests, sort_keys=False))


def sample_command(layout: DemoLayout, port: int, host: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aggregator.sample",
        "--bind-address",
        host,
        "--secure-port",
        str(port),
        "--tls-cert-file",
        layout.path("wardle-serving.crt"),
        "--tls-private-key-file",
        layout.path("wardle-serving.key"),
        "--requestheader-client-ca-file",
        layout.path("front-proxy-ca.crt"),
        "--requestheader-allowed-names",
        "front-proxy-client",
    ]


def gateway_command(layout: DemoLayout, port: int, host: str, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aggregator",
        "serve",
        "--apiservices-dir",
        str(layout.apiservices),
        "--bind-address",
        host,
        "--secure-port",
        str(port),
        "--tls-cert-file",
        layout.path("serving.crt"),
        "--tls-private-key-file",
        layout.path("serving.key"),
        "--client-ca-file",
        layout.path("client-ca.crt"),
        "--requestheader-client-ca-file",
        layout.path("front-proxy-ca.crt"),
        "--requestheader-allowed-names",
        "front-proxy-client",
        "--proxy-client-cert-file",
        layout.path("front-proxy-client.crt"),
        "--proxy-client-key-file",
        layout.path("front-proxy-client.key"),
        *extra,
    ]


def banner(layout: DemoLayout, gateway_port: int, host: str) -> str:
    url = f"https://{host}:{gateway_port}"
    c = layout.certs
    admin = f"kubectl --kubeconfig {layout.admin_kubeconfig}"
    return f"""
The gateway is serving on {url}, in front of the sample extension API server (wardle.example.com).
Try, from another terminal:

  curl --cacert {c}/ca.crt --cert {c}/admin.crt --key {c}/admin.key {url}/apis
  {admin} api-resources
  {admin} get apiservices
  {admin} create -f examples/flunder.yaml
  {admin} get flunders -o wide
  {admin} explain flunders.spec
  kubectl --kubeconfig {layout.alice_kubeconfig} get flunders    # alice has no rights: Forbidden

APIServices, Service and EndpointSlice: {layout.apiservices}/ (edit them; the gateway reloads).
Press Ctrl-C to stop both servers.
"""


async def _relay(name: str, stream: asyncio.StreamReader | None) -> None:
    """Child output, prefixed so the two servers' lines stay apart."""
    if stream is None:
        return
    while line := await stream.readline():
        sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stderr.flush()


async def _wait_ready(host: str, port: int, ctx: ssl.SSLContext, child: asyncio.subprocess.Process) -> None:
    """Until `/readyz` answers 200 over TLS (the sample without a client certificate too)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT
    request = f"GET /readyz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    while loop.time() < deadline:
        if child.returncode is not None:
            raise RuntimeError(f"exited with code {child.returncode} before becoming ready")
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            writer.write(request)
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"not ready on {host}:{port} after {READY_TIMEOUT:.0f}s")


async def _stop(children: list[asyncio.subprocess.Process]) -> None:
    for child in children:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            await asyncio.wait_for(child.wait(), 10)
        except TimeoutError:
            child.kill()
            await child.wait()


async def run_demo(
    certs_dir: str = "certs",
    *,
    host: str = "127.0.0.1",
    gateway_port: int = 8443,
    sample_port: int = 0,
    gateway_args: list[str] | None = None,
) -> int:
    layout = DemoLayout(Path(certs_dir))
    sample_port = sample_port or free_port(host)
    prepare(layout, gateway_port=gateway_port, sample_port=sample_port, host=host)
    ctx = ssl.create_default_context(cafile=layout.path("ca.crt"))
    ctx.check_hostname = False

    children: list[asyncio.subprocess.Process] = []
    relays: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        for name, command, port in (
            ("sample", sample_command(layout, sample_port, host), sample_port),
            ("gateway", gateway_command(layout, gateway_port, host, gateway_args or []), gateway_port),
        ):
            child = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            children.append(child)
            relays.append(asyncio.create_task(_relay(name, child.stdout)))
            try:
                await _wait_ready(host, port, ctx, child)
            except RuntimeError as err:
                print(f"aggregator demo: the {name} server {err}", file=sys.stderr)
                return 1
        print(banner(layout, gateway_port, host), flush=True)
        exited = [asyncio.create_task(child.wait()) for child in children]
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *exited], return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, *exited):
            task.cancel()
        if stopped not in done:
            print("aggregator demo: a server exited; stopping the other", file=sys.stderr)
            return 1
        return 0
    finally:
        await _stop(children)
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        print("aggregator demo: stopped", file=sys.stderr)
