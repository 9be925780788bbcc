"""Nothing passes a refused upgrade (user-needs S1, S2: CVE-2018-1002105, CVE-2020-8559).

A hostile client sends an upgrade request whose body holds a whole second request (identity
headers and all) and pipelines yet another request behind it, framed by Content-Length or chunked,
over SPDY or WebSocket; the backend refuses the upgrade. The backend here is a strict HTTP/1.1
server, as Go's is: it frames the body, answers, then keeps reading the connection. It must see
exactly one request with exactly the declared body, and then the end of the connection: not one
byte more, and never a second request. The client must get the refusal and a closed connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from aggregator.server import GatewayServer
from tests.proxy.test_upgrade import EXEC, read_body
from tests.support.backend import RawBackend, Received
from tests.support.pki import PKI
from tests.support.rawhttp import RawConnection, request_bytes

SMUGGLED = (
    b"GET /apis/demo.example.com/v1/namespaces/kube-system/secrets HTTP/1.1\r\nHost: backend\r\n"
    b"X-Remote-User: system:admin\r\nX-Remote-Group: system:masters\r\n\r\n"
)
PIPELINED = b"DELETE /apis/demo.example.com/v1/namespaces/default/things HTTP/1.1\r\nHost: backend\r\n\r\n"
UPGRADES = {
    "spdy": ("POST", [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]),
    "websocket": (
        "GET",
        [
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
    ),
}
REFUSAL = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403}).encode()


def framed(body: bytes, framing: str) -> tuple[list[tuple[str, str]], bytes]:
    if framing == "length":
        return [("Content-Length", str(len(body)))], body
    return [("Transfer-Encoding", "chunked")], b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@dataclass
class StrictBackend:
    """What the strict backend saw on the upgrade's connection after the request it answered."""

    status: int
    read_body_first: bool = True
    bodies: list[bytes] = field(default_factory=list)
    after: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def respond(
        self, _raw: RawBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: Received
    ) -> None:
        if self.read_body_first:
            self.bodies.append(await read_body(reader, req))
        reason = {403: "Forbidden", 200: "OK"}[self.status]
        writer.write(
            f"HTTP/1.1 {self.status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(REFUSAL)}\r\n\r\n".encode()
            + REFUSAL
        )
        await writer.drain()
        # Then read on, as a keep-alive server would look for the next request: whatever comes
        # is recorded, until the gateway closes the connection.
        while data := await reader.read(65536):
            self.after += data
        self.ended.set()


StartRaw = Callable[..., Awaitable[tuple[GatewayServer, RawBackend]]]


@pytest.mark.parametrize("status", [403, 200], ids=["403", "200"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_a_refused_upgrade_passes_the_declared_body_and_not_one_byte_more(
    raw_gateway: StartRaw, pki: PKI, upgrade: str, framing: str, status: int
) -> None:
    strict = StrictBackend(status)
    server, raw = await raw_gateway(strict.respond)
    method, headers = UPGRADES[upgrade]
    framing_headers, body = framed(SMUGGLED, framing)
    client = await RawConnection.open(server.port, pki)
    # The head, a body holding a request, and a request pipelined behind it: one write.
    client.send(request_bytes(method, EXEC, [*headers, *framing_headers], body) + PIPELINED)
    answer = await client.answer()
    if status == 403:
        assert (answer.status, answer.body) == (403, REFUSAL)  # relayed
    else:
        assert answer.status == 503  # upstream's `invalid upgrade response: status code 200`
        assert json.loads(answer.body)["message"] == "invalid upgrade response: status code 200"
    assert answer.header("Connection") == "close"
    client.send(PIPELINED)
    assert await client.closed_by_peer()
    client.close()

    await asyncio.wait_for(strict.ended.wait(), 10)  # the gateway closed the backend connection
    assert [(r.method, r.raw_path) for r in raw.seen_by("admin")] == [(method, EXEC)]  # exactly one
    assert strict.bodies == [SMUGGLED]  # the declared body, as a body
    assert bytes(strict.after) == b""  # and nothing after it


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_an_answer_before_the_body_ends_it(
    raw_gateway: StartRaw, pki: PKI, upgrade: str, framing: str
) -> None:
    """The client announces a body and holds it back; the backend refuses at once. The client gets
    the refusal without waiting for the upgrade's 60 s deadline, and the body it sends afterwards
    (a request) never reaches the backend."""
    strict = StrictBackend(403, read_body_first=False)
    server, raw = await raw_gateway(strict.respond)
    method, headers = UPGRADES[upgrade]
    framing_headers, body = framed(SMUGGLED, framing)
    client = await RawConnection.open(server.port, pki)
    client.send(request_bytes(method, EXEC, [*headers, *framing_headers]))
    answer = await client.answer()  # RawConnection waits 10 s at most
    assert (answer.status, answer.body) == (403, REFUSAL)
    client.send(body + PIPELINED)
    assert await client.closed_by_peer()
    client.close()

    await asyncio.wait_for(strict.ended.wait(), 10)
    assert len(raw.seen_by("admin")) == 1
    assert bytes(strict.after) == b""
