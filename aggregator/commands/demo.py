"""`aggregator demo`: the whole path in one command, with nothing but this checkout.

Creates the PKI in `certs/` (once), a serving certificate for the sample server valid for
`api.wardle.svc` (the name the gateway verifies), two users (admin in system:masters, and alice
who may only read fischers), the APIService/Service/EndpointSlice manifests that register the
sample and the RBAC manifests that say so (`demorbac.py`; `demofiles.py`: ports checked first, the
user's edits never overwritten), then starts the sample extension API server and the gateway in
local mode as child processes and prints what to try.

The demo exists to show the gateway's headline feature, so the sample dying is part of the show:
the gateway keeps serving (wardle.example.com answers 503, stays in `/apis` marked Stale, its
APIServices turn False within about a second), the demo says so, and Enter starts the sample
again on the same port; the demo then asks the gateway for wardle.example.com, which has the
gateway re-check it at once, and reports when both APIServices are Available again. The gateway
dying, or Ctrl-C, stops the demo. The children run in their own session, so Ctrl-C in the
terminal reaches the demo only, which stops them in order; and they die with the demo however it
ends (`kill -9` included: the kernel sends them SIGTERM, util/parentdeath.py), so none is left
holding a port or serving files a new demo rewrites.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shlex
import signal
import ssl
import stat
import sys
import threading
from pathlib import Path
from typing import TextIO

import aiohttp

from aggregator.commands.certs import init_pki, kubeconfig
from aggregator.commands.demofiles import (
    DemoError,
    DemoLayout,
    GeneratedFiles,
    Ports,
    choose_ports,
    folder_lock,
    yaml_bytes,
)
from aggregator.commands.demorbac import VIEWERS, demo_rbac, rbac_manifests
from aggregator.commands.wardle import GROUP, MODULE, VERSIONS, local_manifests
from aggregator.tls.issue import issue_client_cert, issue_serving_cert, load_pair, write_pair
from aggregator.util import parentdeath

WARDLE_SERVER_NAME = "api.wardle.svc"
READY_TIMEOUT = 30.0
# How long the demo waits for the gateway to see a restarted sample before saying it did not.
RECOVERY_TIMEOUT = 20.0
WARDLE_APISERVICES = tuple(f"{version}.{GROUP}" for version in VERSIONS)

__all__ = ["DemoLayout", "banner", "prepare", "run_demo"]


def prepare(layout: DemoLayout, ports: Ports, files: GeneratedFiles, *, host: str = "127.0.0.1") -> None:
    """Everything on disk the two servers and the printed commands need. Idempotent; keeps edits."""
    server = f"https://{host}:{ports.gateway}"
    init_pki(layout.certs, server=server)
    certs = layout.certs
    if not (certs / "wardle-serving.crt").exists():
        serving = issue_serving_cert(load_pair(certs, "ca"), [WARDLE_SERVER_NAME, "localhost", host])
        write_pair(certs, "wardle-serving", serving)
    if not (certs / "alice.crt").exists():
        write_pair(
            certs, "alice", issue_client_cert(load_pair(certs, "client-ca"), "alice", [VIEWERS])
        )
    ca_pem = (certs / "ca.crt").read_bytes()
    for path, user in ((layout.admin_kubeconfig, "admin"), (layout.alice_kubeconfig, "alice")):
        config = kubeconfig(server, ca_pem, load_pair(certs, user), user=user)
        files.write(path, yaml_bytes([config]), private=True)

    layout.apiservices.mkdir(parents=True, exist_ok=True)
    files.write(layout.wardle_manifests, yaml_bytes(local_manifests(ca_pem, ports.sample, address=host)))
    files.write(rbac_manifests(layout), yaml_bytes(demo_rbac()))
    files.save()


def sample_command(layout: DemoLayout, port: int, host: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        MODULE,
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
        # The gateway's RBAC decides what alice may do (demorbac.py); the sample trusts her group.
        "--authorization-allow-groups",
        f"system:masters,{VIEWERS}",
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


def aggregator_command() -> str:
    """How to run `aggregator` the way this demo was started (`.venv/bin/aggregator`, or -m)."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "aggregator":
        return shlex.quote(sys.argv[0])
    return f"{shlex.quote(sys.executable)} -m aggregator"


def banner(layout: DemoLayout, ports: Ports, host: str, *, sample_pid: int, interactive: bool) -> str:
    url = f"https://{host}:{ports.gateway}"
    c = layout.certs
    again = (
        "Press Enter here to start it again."
        if interactive
        else "Restart the demo to bring it back (its stdin is not a terminal)."
    )
    return f"""
The gateway is serving on {url}, in front of the sample extension API server (wardle.example.com,
pid {sample_pid}; it keeps its objects in memory, so they are gone when it restarts).
Try, from another terminal:

  export KUBECONFIG={shlex.quote(str(layout.admin_kubeconfig.resolve()))}
  kubectl api-resources
  kubectl get apiservices
  kubectl create -f examples/flunder.yaml
  kubectl get flunders -o wide
  kubectl explain flunders.spec
  kubectl --kubeconfig {layout.alice_kubeconfig} get fischers    # alice may read fischers ({rbac_manifests(layout)})
  kubectl --kubeconfig {layout.alice_kubeconfig} get flunders    # but not flunders: Forbidden, by the gateway
  kubectl --kubeconfig {layout.alice_kubeconfig} --as=x --as-group=system:masters get flunders   # nor impersonate
  curl --cacert {c}/ca.crt --cert {c}/admin.crt --key {c}/admin.key {url}/apis
  {aggregator_command()} check --all --apiservices-dir {layout.apiservices}

See a failure: kill the sample server (kill "$(cat {layout.sample_pid})"); the gateway keeps serving
and says which hop fails. {again}
APIServices, Service and EndpointSlice: {layout.apiservices}/ (edit them; the gateway reloads; the
demo never overwrites your changes).
Press Ctrl-C to stop both servers.
"""


# --- child processes ---------------------------------------------------------------------------------


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
            raise DemoError(f"exited with code {child.returncode} before becoming ready")
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
    raise DemoError(f"not ready on {host}:{port} after {READY_TIMEOUT:.0f}s")


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class Child:
    """One server process: started in its own session, output relayed, stopped with SIGTERM."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.command = command
        self.process: asyncio.subprocess.Process | None = None
        self._relay: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> asyncio.subprocess.Process:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self._relay = asyncio.create_task(_relay(self.name, self.process.stdout))
        return self.process

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    async def stop(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._relay is not None:
            await asyncio.gather(self._relay, return_exceptions=True)
            self._relay = None


def _read_lines(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    """Stdin lines onto the loop's queue (a thread: a blocking read never holds the loop)."""
    try:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)
    except (OSError, ValueError, RuntimeError):
        return  # a background job reading its terminal (SIGTTIN ignored: EIO), or the loop is gone


def _interactive() -> bool:
    """Read Enter from stdin? A terminal or a pipe (tests drive the demo through one); not /dev/null."""
    try:
        stdin = sys.stdin
        if stdin is None or stdin.closed:
            return False
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stdin.isatty() or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


# --- the run -----------------------------------------------------------------------------------------


class Demo:
    def __init__(
        self, layout: DemoLayout, ports: Ports, host: str, gateway_args: list[str], out: TextIO
    ) -> None:
        self.layout = layout
        self.ports = ports
        self.host = host
        self.out = out
        # Both die with the demo, however it ends (kill -9 included): see util/parentdeath.py.
        me = os.getpid()
        self.sample = Child("sample", parentdeath.command(me, sample_command(layout, ports.sample, host)))
        self.gateway = Child(
            "gateway", parentdeath.command(me, gateway_command(layout, ports.gateway, host, gateway_args))
        )
        self.ctx = ssl.create_default_context(cafile=layout.path("ca.crt"))
        self.ctx.check_hostname = False
        self.interactive = _interactive()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    async def start_sample(self) -> None:
        process = await self.sample.start()
        self.layout.sample_pid.write_text(f"{process.pid}\n")
        await _wait_ready(self.host, self.ports.sample, self.ctx, process)

    async def run(self, stop: asyncio.Event) -> int:
        try:
            for child, start in ((self.sample, self.start_sample), (self.gateway, self.start_gateway)):
                try:
                    await start()
                except DemoError as err:
                    self.say(f"aggregator demo: the {child.name} server {err}")
                    return 1
            self.say(
                banner(
                    self.layout,
                    self.ports,
                    self.host,
                    sample_pid=self.sample.pid,
                    interactive=self.interactive,
                )
            )
            return await self.supervise(stop)
        finally:
            await self.gateway.stop()
            await self.sample.stop()
            with contextlib.suppress(OSError):
                self.layout.sample_pid.unlink()

    async def start_gateway(self) -> None:
        await _wait_ready(self.host, self.ports.gateway, self.ctx, await self.gateway.start())

    async def supervise(self, stop: asyncio.Event) -> int:
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        if self.interactive:
            with contextlib.suppress(AttributeError, ValueError):
                signal.signal(signal.SIGTTIN, signal.SIG_IGN)
            threading.Thread(
                target=_read_lines, args=(asyncio.get_running_loop(), lines), name="demo-stdin", daemon=True
            ).start()
        stopped = asyncio.create_task(stop.wait())
        gateway_exit = asyncio.create_task(self.gateway.wait())
        sample_exit: asyncio.Task[int] | None = asyncio.create_task(self.sample.wait())
        enter: asyncio.Task[str | None] | None = (
            asyncio.create_task(lines.get()) if self.interactive else None
        )
        try:
            while True:
                waiting = [t for t in (stopped, gateway_exit, sample_exit, enter) if t is not None]
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if stopped in done:
                    return 0
                if gateway_exit in done:
                    self.say(
                        f"aggregator demo: the gateway exited ({_exit_reason(gateway_exit.result())}); "
                        "stopping the demo"
                    )
                    return 1
                if sample_exit is not None and sample_exit in done:
                    sample_exit = None
                    self.sample_died()
                if enter is not None and enter in done:
                    line = enter.result()
                    enter = asyncio.create_task(lines.get()) if line is not None else None
                    if line is not None and sample_exit is None:
                        if await self.restart_sample():
                            sample_exit = asyncio.create_task(self.sample.wait())
                    elif line is not None:
                        self.say(f"aggregator demo: the sample server is running (pid {self.sample.pid})")
        finally:
            for task in (stopped, gateway_exit, sample_exit, enter):
                if task is not None:
                    task.cancel()

    def sample_died(self) -> None:
        assert self.sample.process is not None
        how = _exit_reason(self.sample.process.returncode)
        again = (
            "Press Enter here to start the sample server again (Ctrl-C stops the demo)."
            if self.interactive
            else "Restart the demo to bring it back."
        )
        self.say(
            f"""
aggregator demo: the sample server exited ({how}); the gateway keeps serving without it.
  wardle.example.com answers 503 and stays in /apis marked Stale; `kubectl get apiservices` shows
  False once a request has failed (or at the next check); `aggregator check --all` names the hop.
  {again}"""
        )

    async def restart_sample(self) -> bool:
        self.say("aggregator demo: starting the sample server again")
        await self.sample.stop()
        try:
            await self.start_sample()
        except DemoError as err:
            self.say(f"aggregator demo: the sample server {err}; press Enter to try again")
            return False
        if await self.wait_available():
            self.say(
                f"aggregator demo: the sample server is back (pid {self.sample.pid}); "
                "wardle.example.com is available again"
            )
        else:
            self.say(
                f"aggregator demo: the sample server is back (pid {self.sample.pid}), but the gateway does not "
                f"see it available after {RECOVERY_TIMEOUT:.0f}s; try `aggregator check --all`"
            )
        return True

    async def wait_available(self) -> bool:
        """Ask the gateway for wardle.example.com until both its APIServices are Available.

        A request refused as unavailable has the gateway re-check the APIService at once, so the
        gateway notices the sample within about a second instead of at its next periodic check.
        """
        ctx = ssl.create_default_context(cafile=self.layout.path("ca.crt"))
        ctx.load_cert_chain(self.layout.path("admin.crt"), self.layout.path("admin.key"))
        base = f"https://{self.host}:{self.ports.gateway}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECOVERY_TIMEOUT
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline:
                try:
                    for version in VERSIONS:
                        async with session.get(f"{base}/apis/{GROUP}/{version}", ssl=ctx) as resp:
                            await resp.read()
                    async with session.get(
                        f"{base}/apis/apiregistration.k8s.io/v1/apiservices", ssl=ctx
                    ) as resp:
                        items = (await resp.json()).get("items") or []
                except (aiohttp.ClientError, OSError, ValueError):
                    items = []
                available = {
                    item["metadata"]["name"]
                    for item in items
                    if any(
                        c.get("type") == "Available" and c.get("status") == "True"
                        for c in (item.get("status") or {}).get("conditions") or ()
                    )
                }
                if set(WARDLE_APISERVICES) <= available:
                    return True
                await asyncio.sleep(0.3)
        return False


def check_sample_installed() -> None:
    """The sample server is a package of its own (samples/wardle), installed beside the gateway by
    `make demo`; a gateway installed alone says how to get it instead of starting half a demo."""
    if importlib.util.find_spec(MODULE) is None:
        raise DemoError(
            f"the sample extension API server ({MODULE}) is not installed in {sys.prefix}: run `make demo` "
            "in a checkout of this repository, or `pip install -e samples/wardle` there"
        )


async def run_demo(
    certs_dir: str = "certs",
    *,
    host: str = "127.0.0.1",
    gateway_port: int = 8443,
    sample_port: int = 0,
    gateway_args: list[str] | None = None,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    layout = DemoLayout(Path(certs_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        check_sample_installed()
        # The lock first (a second demo on this folder names the first one's pid, whatever port it
        # asks for), then the ports: a demo that cannot start touches none of the files.
        with folder_lock(layout):
            files = GeneratedFiles.load(layout)
            ports = choose_ports(layout, files, host=host, gateway_port=gateway_port, sample_port=sample_port)
            prepare(layout, ports, files, host=host)
            files.report(out)
            code = await Demo(layout, ports, host, gateway_args or [], out).run(stop)
    except DemoError as err:
        print(f"aggregator demo: {err}", file=sys.stderr)
        return 1
    print("aggregator demo: stopped", file=sys.stderr)
    return code
