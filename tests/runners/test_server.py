"""What every request gets from the pipeline (Status errors, /version, access logs without secrets),
and how a real `aggregator serve` process shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggregator import __version__
from aggregator.config import complete
from aggregator.runners.server import shut_down
from aggregator.web.options import ShutdownConfig
from tests.conftest import StartGateway
from tests.support.backend import (
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    write_manifests,
)
from tests.support.fixtures import StartProxied
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until_async, until_blocking
from tests.support.ports import free_port
from tests.workers.group import serve_args

pytestmark = pytest.mark.long(15)


async def test_unknown_path_in_local_mode_is_a_404_status(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{server.url}/api/v1/pods", ssl=pki.client_context(), headers={"User-Agent": "kubectl"}
        ) as resp:
            assert resp.status == 404
            assert resp.headers["Content-Type"] == "application/json"
            assert await resp.read() == (
                b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                b'"message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}\n'
            )
        # curl gets it indented, as from kube-apiserver
        async with session.get(
            f"{server.url}/nope", ssl=pki.client_context(), headers={"User-Agent": "curl/8.0"}
        ) as resp:
            text = await resp.text()
            assert text.startswith('{\n  "kind": "Status",\n')
            assert json.loads(text)["code"] == 404


async def test_version_in_local_mode(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/version", ssl=pki.client_context()) as resp,
    ):
        body = await resp.json()
    # The Kubernetes level the gateway follows, the gateway itself in the semver build metadata.
    assert body["gitVersion"] == f"v1.33.0+aggregator.{__version__}"
    assert (body["major"], body["minor"]) == ("1", "33")
    assert list(body)[:3] == ["major", "minor", "gitVersion"]


async def test_access_log_line_never_carries_credentials(
    start_gateway: StartGateway, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await start_gateway(access_log="all")
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{server.url}/livez?x=1",
            ssl=pki.client_context(),
            headers={"Authorization": "Bearer sup3rs3cr3t-token", "X-Remote-Extra-Secret": "hunter2"},
        ) as resp,
    ):
        assert resp.status == 200
    access = [r for r in caplog.records if r.name == "aggregator.access"]
    assert access
    assert fields_of(access[-1])["path"] == "/livez"
    assert fields_of(access[-1])["status"] == 200
    assert "duration_ms" in fields_of(access[-1])
    assert "sup3rs3cr3t" not in caplog.text and "hunter2" not in caplog.text


def test_json_log_lines_are_json() -> None:
    from aggregator.util.logs import JSONFormatter, fields

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.fields = fields(user="alice", token="abc")["fields"]
    doc = json.loads(JSONFormatter().format(record))
    assert doc["msg"] == "hello world" and doc["user"] == "alice"
    assert doc["token"] == "[redacted]"


# --- graceful termination of a real `aggregator serve` process -----------------------------------

WATCH_PATH = f"{PREFIX}/namespaces/default/things"
EXEC_PATH = f"{PREFIX}/namespaces/default/things/t1/exec"


async def endless_watch(request: web.Request) -> web.StreamResponse:
    """A backend watch that sends one event and never ends by itself."""
    if request.query.get("watch") != "true":
        return web.json_response({"kind": "ThingList", "items": []})
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(b'{"type":"ADDED","object":{"kind":"Thing"}}\n')
    await asyncio.Event().wait()  # until the gateway closes the connection
    return response


def websocket_echo(closed: asyncio.Event) -> Any:
    """A backend exec over WebSocket that echoes, and notes when its connection ends."""

    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        try:
            async for message in ws:
                await ws.send_bytes(message.data if message.type == aiohttp.WSMsgType.BINARY else b"?")
        finally:
            closed.set()
        return ws

    return handle


def gateway_process(
    pki: PKI, folder: Path, port: int, log_path: Path, *flags: str
) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            serve_args(pki, folder, port, *flags),
            stderr=log_file,
        )


async def get_status(session: aiohttp.ClientSession, url: str, pki: PKI) -> tuple[int, str] | None:
    """(status, body) of a fresh connection's GET, or None when nothing answers."""
    try:
        async with session.get(url, ssl=pki.client_context(), headers={"Connection": "close"}) as resp:
            return resp.status, await resp.text()
    except (aiohttp.ClientError, OSError):
        return None


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_fails_readyz_then_ends_watches_and_tunnels_and_exits_0(
    backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
    tmp_path: Path,
    workers: int,
) -> None:
    """A single process, and `--workers 2` (each worker runs the same shutdown, the supervisor
    waits for them): the same sequence seen from outside."""
    tunnel_closed_at_backend = asyncio.Event()
    backend.routes[WATCH_PATH] = endless_watch
    backend.routes[EXEC_PATH] = websocket_echo(tunnel_closed_at_backend)
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    port, log_path = free_port(), tmp_path / "serve.log"
    proc = gateway_process(
        pki,
        apiservices_dir,
        port,
        log_path,
        "--shutdown-delay-duration=2s",
        "--shutdown-watch-termination-grace-period=2s",
        f"--workers={workers}",
    )
    url = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as probes, aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                return await get_status(probes, f"{url}/readyz", pki) == (200, "ok")

            await until_async(ready, 60, "the gateway to be ready")
            watch = await session.get(f"{url}{WATCH_PATH}?watch=true", ssl=pki.client_context())
            assert watch.status == 200
            assert b"ADDED" in await asyncio.wait_for(watch.content.readline(), 10)
            tunnel = await session.ws_connect(f"{url}{EXEC_PATH}?command=sh", ssl=pki.client_context())
            await tunnel.send_bytes(b"hello")
            assert (await tunnel.receive(10)).data == b"hello"

            proc.send_signal(signal.SIGTERM)
            # During the delay: not ready, still serving, the watch still open.
            await until_async(
                lambda: readyz_fails(probes, url, pki), 10, "/readyz to fail while still serving"
            )
            assert not watch.content.at_eof()
            # Then the watch ends with its last chunk (a truncated one would raise here) ...
            rest = await asyncio.wait_for(watch.content.read(), 20)
            assert rest == b"" and watch.content.at_eof()
            # ... the tunnel is closed on both sides ...
            message = await tunnel.receive(20)
            assert message.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            )
            await asyncio.wait_for(tunnel_closed_at_backend.wait(), 20)
            watch.release()
            await tunnel.close()
        # ... and the process is gone, cleanly.
        returncode = await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_text = log_path.read_text()
    assert returncode == 0, log_text
    assert "Traceback" not in log_text and "Fatal error" not in log_text, log_text


async def readyz_fails(session: aiohttp.ClientSession, url: str, pki: PKI) -> bool:
    answer = await get_status(session, f"{url}/readyz?verbose", pki)
    if answer is None:
        raise AssertionError("the listener closed before the shutdown delay was over")
    status, body = answer
    if status == 200:
        return False
    assert status == 500 and "[-]shutdown failed" in body, body
    return True


async def test_shut_down_drains_a_request_in_flight_and_closes_idle_connections(
    start_proxied: StartProxied,
) -> None:
    release, arrived = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await release.wait()
        return web.json_response({"kind": "Thing"})

    proxied = await start_proxied()
    proxied.backend.routes[f"{PREFIX}/namespaces/default/things/slow"] = slow
    server = proxied.server
    idle_reader, idle_writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=proxied.pki.client_context(), server_hostname="localhost"
    )

    async def fetch() -> tuple[int, bytes]:
        async with proxied.request("GET", f"{PREFIX}/namespaces/default/things/slow") as resp:
            return resp.status, await resp.read()

    in_flight = asyncio.ensure_future(fetch())
    await asyncio.wait_for(arrived.wait(), 10)
    stopping = asyncio.ensure_future(shut_down(server, ShutdownConfig(request_grace=30)))
    # The idle connection is closed at once; the busy one finishes its request first.
    assert await asyncio.wait_for(idle_reader.read(), 10) == b""
    idle_writer.close()
    assert not stopping.done() and not in_flight.done()
    release.set()
    assert await asyncio.wait_for(in_flight, 10) == (200, b'{"kind": "Thing"}')
    await asyncio.wait_for(stopping, 10)


def test_sigint_stops_cleanly_and_a_second_signal_during_the_delay_exits_1(
    pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    for signals, delay, expected, workers in (
        ([signal.SIGINT], "0s", 0, "1"),
        ([signal.SIGTERM, signal.SIGTERM], "60s", 1, "1"),
        ([signal.SIGTERM, signal.SIGTERM], "60s", 1, "2"),
    ):
        port, log_path = free_port(), tmp_path / f"serve-{expected}-{workers}.log"
        proc = gateway_process(
            pki, apiservices_dir, port, log_path, f"--shutdown-delay-duration={delay}", f"--workers={workers}"
        )
        try:
            wait_for_port(proc, port, log_path)
            for sig in signals:
                proc.send_signal(sig)
                if len(signals) > 1:
                    wait_for_line(log_path, "shutting down")
            returncode = proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log_text = log_path.read_text()
        assert returncode == expected, log_text
        assert "Traceback" not in log_text and "Fatal error" not in log_text, log_text


def wait_for_port(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    def listening() -> bool:
        assert proc.poll() is None, log_path.read_text()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        return False

    until_blocking(listening, 60, lambda: "the gateway to start: " + log_path.read_text())


def wait_for_line(log_path: Path, text: str) -> None:
    until_blocking(lambda: text in log_path.read_text(), 20, lambda: f"{text!r} in:\n{log_path.read_text()}")


def test_generated_serving_certificate_is_announced_only_when_generated(
    pki: PKI, apiservices_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from aggregator.runners.server import GatewayServer
    from tests.support.gateway import local_options

    caplog.set_level(logging.INFO, logger="aggregator.runners.serving")
    options = local_options(
        pki,
        str(apiservices_dir),
        tls_cert_file=None,
        tls_private_key_file=None,
        cert_dir=str(tmp_path / "generated"),
    )

    def announced() -> list[str]:
        return [r.getMessage() for r in caplog.records if "self-signed" in r.getMessage()]

    GatewayServer(complete(options))
    assert announced() == ["generated a self-signed serving certificate"]
    first = (tmp_path / "generated" / "apiserver.crt").read_bytes()
    GatewayServer(complete(options))  # a restart reuses the pair: nothing was generated
    assert announced() == ["generated a self-signed serving certificate"]
    assert (tmp_path / "generated" / "apiserver.crt").read_bytes() == first
