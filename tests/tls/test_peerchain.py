"""The certificates a client sends after its own reach the verifier: intermediate CAs work end to end."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop

from aggregator.tls.issue import load_pair
from aggregator.tls.peer import request_client_certificates
from aggregator.tls.peerchain import PeerChainReader
from tests.conftest import StartGateway
from tests.support.certbuilder import Cert, Spec, issue, write_chain
from tests.support.pki import PKI

UNAUTHORIZED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
    b'"reason":"Unauthorized","code":401}\n'
)


def client_ca(pki: PKI) -> Cert:
    pair = load_pair(pki.dir, "client-ca")
    return Cert(pair.cert, pair.key)


def client_context(pki: PKI, directory: Path, stem: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.path("ca.crt"))
    ctx.load_cert_chain(str(directory / f"{stem}.crt"), str(directory / f"{stem}.key"))
    return ctx


async def get(url: str, ctx: ssl.SSLContext) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=ctx) as resp:
        return resp.status, await resp.read()


async def test_client_certificate_from_an_intermediate_ca_is_accepted_when_the_chain_is_sent(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    team_ca = issue(Spec("team-ca", ca=True), client_ca(pki))
    leaf = issue(Spec("alice", ("system:masters",)), team_ca)
    server = await start_gateway()
    chained = write_chain(tmp_path, "chained", leaf, team_ca)
    assert (await get(server.url + "/apis", client_context(pki, tmp_path, chained)))[0] == 200
    alone = write_chain(tmp_path, "alone", leaf)
    assert await get(server.url + "/apis", client_context(pki, tmp_path, alone)) == (401, UNAUTHORIZED)


async def test_chain_through_a_stranger_intermediate_is_401(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    stranger_root = issue(Spec("client-ca", ca=True))  # the client CA's name, not its key
    stranger_ca = issue(Spec("team-ca", ca=True), stranger_root)
    leaf = issue(Spec("mallory", ("system:masters",)), stranger_ca)
    server = await start_gateway()
    stem = write_chain(tmp_path, "stranger", leaf, stranger_ca, stranger_root)
    assert await get(server.url + "/apis", client_context(pki, tmp_path, stem)) == (401, UNAUTHORIZED)


async def read_on_a_server(pki: PKI, directory: Path, stem: str) -> tuple[bytes, tuple[bytes, ...]]:
    """Serve one TLS connection that requests (and does not judge) a client certificate."""
    reader = PeerChainReader()
    assert reader.available
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.path("serving.crt"), pki.path("serving.key"))
    assert request_client_certificates(server_ctx, lambda: [])
    seen: asyncio.Future[tuple[bytes, tuple[bytes, ...]]] = asyncio.get_running_loop().create_future()

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        seen.set_result((ssl_object.getpeercert(binary_form=True), reader.intermediates(ssl_object)))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    async with server:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(pki, directory, stem), server_hostname="localhost"
        )
        async with asyncio.timeout(10):
            result = await seen
        writer.close()
    return result


def run_in(loop_factory: Callable[[], asyncio.AbstractEventLoop], coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coro)


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_reader_returns_what_the_client_sent_after_its_certificate(
    pki: PKI, tmp_path: Path, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    middle = issue(Spec("middle-ca", ca=True), client_ca(pki))
    team = issue(Spec("team-ca", ca=True), middle)
    leaf = issue(Spec("bob"), team)
    stem = write_chain(tmp_path, "bob", leaf, team, middle)
    der, intermediates = run_in(loop_factory, read_on_a_server(pki, tmp_path, stem))
    assert der == leaf.der
    assert intermediates == (team.der, middle.der)
    alone = write_chain(tmp_path, "alone", leaf)
    assert run_in(loop_factory, read_on_a_server(pki, tmp_path, alone))[1] == ()
