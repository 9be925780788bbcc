"""Nothing passes a refused upgrade (user-needs S1, S2: CVE-2018-1002105, CVE-2020-8559).

A hostile client sends an upgrade request whose body holds a whole second request (identity
headers and all) and pipelines yet another request behind it, framed by Content-Length or chunked,
over SPDY or WebSocket. kube-apiserver forwards the body; a backend that refuses the upgrade
without reading it (Python's `http.server` does) then reads that body as a second request, on the
gateway's front-proxy connection, with the identity headers the attacker wrote. The gateway refuses
any upgrade with a body with a 400 before it dials anything: the backend hears of nothing, the
client gets the refusal and a closed connection. An upgrade without a body that the backend
refuses passes nothing either: the pipelined request after it is never read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from aggregator.proxy.upgrade import BODY_REFUSED
from aggregator.runners.server import GatewayServer
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


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_an_upgrade_with_a_body_is_refused_before_any_backend_hears_of_it(
    raw_gateway: StartRaw, pki: PKI, upgrade: str, framing: str
) -> None:
    lenient = StrictBackend(403, read_body_first=False)  # refuses without reading the body
    server, raw = await raw_gateway(lenient.respond)
    method, headers = UPGRADES[upgrade]
    framing_headers, body = framed(SMUGGLED, framing)
    client = await RawConnection.open(server.port, pki)
    # The head, a body holding a request, and a request pipelined behind it: one write.
    client.send(request_bytes(method, EXEC, [*headers, *framing_headers], body) + PIPELINED)
    answer = await client.answer()
    assert answer.status == 400
    assert json.loads(answer.body)["message"] == BODY_REFUSED
    assert answer.header("Connection") == "close"
    assert await client.closed_by_peer()
    client.close()
    assert raw.seen_by("admin") == []  # not the upgrade, not its body, not the pipelined request
    assert server.gateway.metrics.proxy.upgrade_rejected.labels("body")._value.get() == 1


@pytest.mark.parametrize("status", [403, 200], ids=["403", "200"])
@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_a_refused_upgrade_passes_not_one_byte_more(
    raw_gateway: StartRaw, pki: PKI, upgrade: str, status: int
) -> None:
    strict = StrictBackend(status, read_body_first=False)
    server, raw = await raw_gateway(strict.respond)
    method, headers = UPGRADES[upgrade]
    client = await RawConnection.open(server.port, pki)
    # The upgrade and a request pipelined behind it: one write.
    client.send(request_bytes(method, EXEC, headers) + PIPELINED)
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
    assert bytes(strict.after) == b""  # and nothing after it
