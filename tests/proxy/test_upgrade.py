"""exec/attach/port-forward upgrades through the gateway: SPDY/3.1 and WebSocket, and refusals.

The refusals are the security cases S1 (CVE-2018-1002105: a refused upgrade must not leave a
connection a client can keep talking on) and S2 (CVE-2020-8559: non-101 answers are errors,
redirects are never passed on).
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from aggregator.runners.server import GatewayServer
from aggregator.wire.wsprotocol import BEARER_PROTOCOL_PREFIX
from tests.proxy.conftest import RawGateway, RawRespond
from tests.support.backend import (
    PREFIX,
    RawBackend,
    Received,
    parse_request_head,
)
from tests.support.fakekube import FakeKube
from tests.support.fakereviews import FakeReviews
from tests.support.fixtures import Proxied, StartProxied
from tests.support.pki import PKI

EXEC = f"{PREFIX}/namespaces/default/things/t1/exec?command=sh&stdin=true"
SPDY_HEADERS = [
    ("Connection", "Upgrade"),
    ("Upgrade", "SPDY/3.1"),
    ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
]


async def open_client(
    server: GatewayServer, pki: PKI, cert: str | None = "admin"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=pki.client_context(cert), server_hostname="localhost"
    )


def request_bytes(method: str, path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
    body = await asyncio.wait_for(reader.readexactly(length), 5) if length else b""
    return status, headers, body


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(65536), 5)
    except (ConnectionError, ssl.SSLError):
        return True
    return data == b""


async def switch_and_echo(
    _raw: RawBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: Received
) -> None:
    protocol = req.one("Upgrade") or ""
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "
        + protocol.encode()
        + b"\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
    )
    while data := await reader.read(65536):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


def refuse(status: int, extra: str = "", body: bytes = b"") -> RawRespond:
    async def respond(
        _raw: RawBackend, _r: asyncio.StreamReader, writer: asyncio.StreamWriter, _req: Received
    ) -> None:
        reason = {403: "Forbidden", 302: "Found", 200: "OK", 500: "Internal Server Error"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        # Deliberately keep the connection open, as a careless backend would.

    return respond


async def test_spdy_upgrade_is_spliced_with_identity_set_and_spoofs_removed(
    raw_gateway: RawGateway, pki: PKI
) -> None:
    server, raw = await raw_gateway(
        switch_and_echo,
        requestheader_username_headers=["X-Auth-User"],
        requestheader_group_headers=["X-Auth-Groups"],
        requestheader_extra_headers_prefix=["X-Auth-Extra-"],
    )
    reader, writer = await open_client(server, pki)
    spoofed = [
        ("X-Remote-User", "evil"),
        ("x-remote-group", "system:masters"),
        ("X-REMOTE-EXTRA-scopes", "all"),
        ("x-auth-user", "evil"),
        ("X-Auth-Groups", "system:masters"),
        ("X-Auth-Groups", "system:masters"),
        ("X-Auth-Extra-Scopes", "*"),
        ("Authorization", "Bearer stolen"),
        # Look-alikes a CGI or WSGI backend reads as the same headers.
        ("X-Remote_User", "look-alike"),
        ("X_Remote_Group", "look-alike"),
        ("X_Auth_User", "look-alike"),
        ("X-Auth-Extra_Scopes", "look-alike"),
    ]
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS + spoofed))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"X-Stream-Protocol-Version: v4.channel.k8s.io" in head
    # Bytes flow both ways, including more than any single buffer.
    big = b"x" * (3 * 1024 * 1024)
    writer.write(b"hello spdy")
    assert await asyncio.wait_for(reader.readexactly(10), 5) == b"HELLO SPDY"
    writer.write(big)
    assert await asyncio.wait_for(reader.readexactly(len(big)), 10) == big.upper()
    writer.close()

    (seen,) = raw.seen_by("admin")
    assert seen.peer_cn == "front-proxy-client"
    assert seen.method == "POST"
    assert seen.raw_path == EXEC
    assert seen.all("X-Remote-User") == ["admin"]
    assert seen.all("X-Remote-Group") == ["system:masters", "system:authenticated"]
    assert seen.one("Upgrade") == "SPDY/3.1"
    assert seen.one("Connection") == "Upgrade"
    assert seen.one("X-Forwarded-For") == "127.0.0.1"
    for name in ("x-auth-user", "x-auth-groups", "x-auth-extra-scopes", "authorization"):
        assert seen.all(name) == []
    assert [k for k, v in seen.headers if v == "look-alike"] == []
    assert [v for k, v in seen.headers if k.lower().startswith("x-remote-extra-scopes")] == []


async def test_websocket_exec_round_trip(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()

    async def exec_ws(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"\x01" + msg.data[1:].upper())
            elif msg.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str("echo:" + msg.data)
        return ws

    proxied.backend.routes[EXEC.split("?")[0]] = exec_ws
    async with proxied.session.ws_connect(
        proxied.url + EXEC,
        protocols=("v5.channel.k8s.io",),
        ssl=proxied.pki.client_context(),
        headers={"X-Remote-User": "evil", "X-Remote-Group": "system:masters"},
    ) as ws:
        assert ws.protocol == "v5.channel.k8s.io"
        await ws.send_bytes(b"\x00ls -l\n")
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.data == b"\x01LS -L\n"
        await ws.send_str("hi")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == "echo:hi"
    (seen,) = proxied.backend.seen_by("admin")
    assert seen.all("X-Remote-User") == ["admin"]
    assert seen.all("X-Remote-Group") == ["system:masters", "system:authenticated"]
    assert seen.one("Sec-WebSocket-Protocol") == "v5.channel.k8s.io"
    # The gateway keeps serving ordinary requests after a tunnel.
    async with proxied.request("GET", PREFIX + "/things") as resp:
        assert resp.status == 200


WS_SECRET = "exec-s3cr3t-token-0123456789"


def exec_echo_route(proxied: Proxied) -> None:
    async def exec_ws(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"\x01" + msg.data[1:].upper())
        return ws

    proxied.backend.routes[EXEC.split("?")[0]] = exec_ws


@pytest.mark.parametrize("source", ["token-file", "tokenreview"])
async def test_websocket_exec_with_a_subprotocol_token(
    start_proxied: StartProxied, fake_kube: FakeKube, tmp_path: Path, source: str
) -> None:
    """A browser's exec: no client certificate, no Authorization, the token offered as a subprotocol.
    The backend is told who the caller is and never sees the token."""
    if source == "token-file":
        tokens = tmp_path / "tokens.csv"
        tokens.write_text(f'{WS_SECRET},erin,uid-e,"devs"\n')
        proxied = await start_proxied(token_auth_file=str(tokens))
    else:
        FakeReviews(fake_kube).add_user(WS_SECRET, "erin", uid="uid-e", groups=("devs",))
        proxied = await start_proxied(kubeconfig=str(fake_kube.kubeconfig))
    exec_echo_route(proxied)
    offered = BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(WS_SECRET.encode()).decode().rstrip("=")
    async with proxied.session.ws_connect(
        proxied.url + EXEC, protocols=(offered, "v5.channel.k8s.io"), ssl=proxied.pki.client_context(None)
    ) as ws:
        assert ws.protocol == "v5.channel.k8s.io"
        await ws.send_bytes(b"\x00ls -l\n")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == b"\x01LS -L\n"
    (seen,) = proxied.backend.seen_by("erin")
    assert seen.all("X-Remote-User") == ["erin"]
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert seen.one("Sec-WebSocket-Protocol") == "v5.channel.k8s.io"
    encoded = offered[len(BEARER_PROTOCOL_PREFIX) :]
    for name, value in seen.headers:
        assert WS_SECRET not in value and encoded not in value and "bearer" not in value.lower(), name


async def test_a_subprotocol_token_is_dropped_whoever_the_caller_is(start_proxied: StartProxied) -> None:
    """A client-certificate caller (a proxy passing a browser's handshake on) is authenticated by its
    certificate; the token entry it carries still stops at the gateway (upstream would forward it)."""
    proxied = await start_proxied()
    exec_echo_route(proxied)
    offered = BEARER_PROTOCOL_PREFIX + "c29tZS10b2tlbg"
    async with proxied.session.ws_connect(
        proxied.url + EXEC, protocols=("v5.channel.k8s.io", offered), ssl=proxied.pki.client_context()
    ) as ws:
        assert ws.protocol == "v5.channel.k8s.io"
    (seen,) = proxied.backend.seen_by("admin")
    assert seen.one("Sec-WebSocket-Protocol") == "v5.channel.k8s.io"


async def test_refused_upgrade_is_relayed_and_the_connection_closed(
    raw_gateway: RawGateway, pki: PKI
) -> None:
    """S1: a 403 to an upgrade, then a second request pipelined on the same socket."""
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403}).encode()
    server, raw = await raw_gateway(refuse(403, "Access-Control-Allow-Origin: *\r\n", body))
    reader, writer = await open_client(server, pki)
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS))
    status, headers, got = await read_response(reader)
    assert status == 403
    assert got == body
    assert ("Connection", "close") in headers
    assert not any(k.lower() == "access-control-allow-origin" for k, _ in headers)
    # The client tries to reuse the socket for another request: nobody must read it.
    writer.write(request_bytes("GET", f"{PREFIX}/namespaces/default/secrets", []))
    assert await closed_by_peer(reader)
    writer.close()
    assert [r.raw_path for r in raw.seen_by("admin")] == [EXEC]
    assert len(raw.upgrade_connections) == 1
    rejected = server.gateway.metrics.registry.get_sample_value(
        "aggregator_upgrade_rejected_total", {"reason": "non101"}
    )
    assert rejected == 1.0


@pytest.mark.parametrize(
    ("status", "extra"),
    [(302, "Location: https://127.0.0.1:10250/run/kube-system/etcd\r\n"), (200, "")],
    ids=["redirect", "ok"],
)
async def test_non_101_success_answer_to_an_upgrade_is_503(
    raw_gateway: RawGateway, pki: PKI, status: int, extra: str
) -> None:
    """S2: redirects and 2xx are never passed on as answers to an upgrade."""
    server, raw = await raw_gateway(refuse(status, extra, b"{}"))
    reader, writer = await open_client(server, pki)
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS))
    code, headers, body = await read_response(reader)
    assert code == 503
    assert not any(k.lower() == "location" for k, _ in headers)
    assert json.loads(body)["message"] == f"invalid upgrade response: status code {status}"
    assert await closed_by_peer(reader)
    writer.close()
    assert len(raw.upgrade_connections) == 1
    assert len(raw.seen_by("admin")) == 1


@pytest.mark.parametrize(
    ("path", "headers", "message"),
    [
        (
            EXEC,
            [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c")],
            'upgrade to "h2c" is not supported',
        ),
        (EXEC, [("Connection", "Upgrade"), ("Upgrade", "tcp")], 'upgrade to "tcp" is not supported'),
        (PREFIX, SPDY_HEADERS, f'upgrade requests are not allowed on path "{PREFIX}"'),
        (PREFIX + "/", SPDY_HEADERS, f'upgrade requests are not allowed on path "{PREFIX}/"'),
        ("/apis", SPDY_HEADERS, 'upgrade requests are not allowed on path "/apis"'),
        ("/healthz", SPDY_HEADERS, 'upgrade requests are not allowed on path "/healthz"'),
        ("/metrics", [("Connection", "upgrade"), ("Upgrade", "websocket")], "not allowed on path"),
    ],
)
async def test_upgrades_refused_without_contacting_the_backend(
    raw_gateway: RawGateway, pki: PKI, path: str, headers: list[tuple[str, str]], message: str
) -> None:
    server, raw = await raw_gateway(switch_and_echo)
    reader, writer = await open_client(server, pki)
    writer.write(request_bytes("GET", path, headers))
    status, _headers, body = await read_response(reader)
    assert status == 400
    assert message in json.loads(body)["message"]
    assert await closed_by_peer(reader)
    writer.close()
    assert raw.seen_by("admin") == []
    assert raw.upgrade_connections == set()


async def test_upgrade_to_an_unreachable_backend_is_503(raw_gateway: RawGateway, pki: PKI) -> None:
    server, raw = await raw_gateway(switch_and_echo)
    port = raw.port
    await raw.stop()
    reader, writer = await open_client(server, pki)
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS))
    status, _headers, body = await read_response(reader)
    assert status == 503
    assert json.loads(body)["message"] == f"dial tcp 127.0.0.1:{port}: connect: connection refused"
    writer.close()


async def test_upgrade_without_credentials_is_401(raw_gateway: RawGateway, pki: PKI) -> None:
    server, raw = await raw_gateway(switch_and_echo)
    reader, writer = await open_client(server, pki, cert=None)
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS))
    status, _headers, _body = await read_response(reader)
    assert status == 401
    writer.close()
    assert raw.seen_by("admin") == []
    assert raw.upgrade_connections == set()


def test_parse_request_head_helper() -> None:
    assert parse_request_head(b"GET /x HTTP/1.1\r\nA: b\r\n\r\n") == ("GET", "/x", [("A", "b")])


async def read_body(reader: asyncio.StreamReader, req: Received) -> bytes:
    """The request body as a strict HTTP/1.1 server frames it: Content-Length, or chunked."""
    length = req.one("Content-Length")
    if length is not None:
        return await reader.readexactly(int(length))
    if (req.one("Transfer-Encoding") or "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return body
    return b""


@pytest.mark.parametrize(
    ("upgrade", "framing"),
    [("SPDY/3.1", "length"), ("SPDY/3.1", "chunked"), ("websocket", "length"), ("websocket", "empty")],
)
async def test_an_upgrade_request_with_a_body_is_refused_and_one_without_tunnels(
    raw_gateway: RawGateway, pki: PKI, upgrade: str, framing: str
) -> None:
    """No exec, attach, port-forward or WebSocket upgrade carries a body: one that does is refused
    with a 400 Status before anything is dialed (docs/differences.md); `Content-Length: 0` is no
    body, and tunnels."""
    server, raw = await raw_gateway(switch_and_echo)
    reader, writer = await open_client(server, pki)
    headers = [("Connection", "Upgrade"), ("Upgrade", upgrade)]
    if upgrade == "websocket":
        headers += [("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]
    if framing == "length":
        payload = request_bytes("POST", EXEC, [*headers, ("Content-Length", "11")]) + b"hello world"
    elif framing == "chunked":
        payload = request_bytes("POST", EXEC, [*headers, ("Transfer-Encoding", "chunked")])
        payload += b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    else:
        payload = request_bytes("POST", EXEC, [*headers, ("Content-Length", "0")])
    writer.write(payload)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    if framing == "empty":
        assert head.startswith(b"HTTP/1.1 101 ")
        writer.write(b"tunnel bytes")
        assert await asyncio.wait_for(reader.readexactly(12), 5) == b"TUNNEL BYTES"
        writer.close()
        assert len(raw.seen_by("admin")) == 1
        return
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"upgrade requests with a body are not supported" in await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert raw.seen_by("admin") == []


async def test_shutdown_closes_an_open_tunnel_on_both_sides(raw_gateway: RawGateway, pki: PKI) -> None:
    backend_saw_close = asyncio.Event()

    async def echo_until_closed(
        raw: RawBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: Received
    ) -> None:
        try:
            await switch_and_echo(raw, reader, writer, req)
        finally:
            backend_saw_close.set()

    server, _raw = await raw_gateway(echo_until_closed)
    reader, writer = await open_client(server, pki)
    writer.write(request_bytes("POST", EXEC, SPDY_HEADERS))
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101 ")
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"PING"
    assert server.gateway.in_flight.long_running == 1

    # What the shutdown does once the listener has closed: the server itself is still running.
    assert await server.gateway.in_flight.end_long_running(0) == 0
    assert await closed_by_peer(reader)
    await asyncio.wait_for(backend_saw_close.wait(), 5)
    writer.close()
