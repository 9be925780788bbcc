"""Backend redirects (CVE-2022-3172) on every way to a backend, driven through a running gateway.

The backend is hostile: it tries to send clients (and the gateway's own fetches and probes) to an
attacker's listener with every shape of redirect. Nothing may connect there, and no redirect may
reach a client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from multidict import CIMultiDict

from aggregator.availability.conditions import REDIRECT_REJECTED
from aggregator.wire.redirects import REDIRECT_MESSAGE, is_redirect, without_redirect_headers
from tests.support.backend import APISERVICE, GROUP, PREFIX, VERSION, Handler, status_of
from tests.support.fixtures import Proxied, StartProxied
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"


@dataclass
class Attacker:
    """A listener a redirect points at: it only counts who connects."""

    port: int
    connections: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/steal"


@pytest.fixture
async def attacker() -> AsyncIterator[Attacker]:
    found = Attacker(0)

    async def count(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        found.connections += 1
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    found.port = int(server.sockets[0].getsockname()[1])
    yield found
    server.close()
    await server.wait_closed()


def answer(status: int, headers: list[tuple[str, str]], body: bytes = b"") -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers=CIMultiDict(headers), body=body)

    return handler


def test_every_3xx_but_304_is_a_redirect() -> None:
    assert [code for code in range(200, 600) if is_redirect(code)] == [
        300,
        301,
        302,
        303,
        305,
        306,
        307,
        308,
        *range(309, 400),
    ]
    headers = [("Location", ""), ("ETag", '"x"'), ("location", "https://a"), ("Refresh", "0; url=https://a")]
    assert without_redirect_headers(headers) == [("ETag", '"x"')]


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (302, [("Location", ""), ("Location", "{attacker}")]),  # upstream reads only the first value
        (301, [("Location", " "), ("Location", "{attacker}")]),
        (302, []),  # no Location at all
        (307, [("Refresh", "0; url={attacker}")]),  # browsers follow Refresh
        (300, [("Link", "<{attacker}>; rel=alternate")]),
        (308, [("Location", "{attacker}")]),
    ],
    ids=["empty-then-attacker", "blank-then-attacker", "no-location", "refresh-only", "300-link", "308"],
)
async def test_proxied_redirects_of_any_shape_become_502(
    start_proxied: StartProxied, attacker: Attacker, status: int, headers: list[tuple[str, str]]
) -> None:
    proxied = await start_proxied()
    filled = [(name, value.format(attacker=attacker.url)) for name, value in headers]
    proxied.backend.routes[THINGS] = answer(status, filled, f"go to {attacker.url}".encode())
    async with proxied.request("GET", THINGS, allow_redirects=True) as resp:
        assert resp.status == 502
        assert "Location" not in resp.headers and "Refresh" not in resp.headers
        assert status_of(await resp.read())["message"] == REDIRECT_MESSAGE
    assert len(proxied.backend.seen_by("admin")) == 1
    assert attacker.connections == 0


async def test_not_modified_is_relayed_without_location_or_refresh(
    start_proxied: StartProxied, attacker: Attacker
) -> None:
    proxied = await start_proxied()
    proxied.backend.routes[THINGS] = answer(
        304,
        [
            ("ETag", '"v1"'),
            ("Location", ""),
            ("Location", attacker.url),
            ("Refresh", f"0; url={attacker.url}"),
        ],
    )
    async with proxied.request("GET", THINGS, headers={"If-None-Match": '"v1"'}) as resp:
        assert resp.status == 304
        assert resp.headers["ETag"] == '"v1"'
        assert resp.headers.getall("Location", []) == [] and "Refresh" not in resp.headers
    assert attacker.connections == 0


async def test_a_created_answer_keeps_its_location(start_proxied: StartProxied) -> None:
    """Location on a 2xx names the new object (201 Created): not a redirect, relayed as is."""
    proxied = await start_proxied()
    proxied.backend.routes[THINGS] = answer(201, [("Location", f"{THINGS}/x")], b"{}")
    async with proxied.request("POST", THINGS, data=b"{}") as resp:
        assert resp.status == 201
        assert resp.headers["Location"] == f"{THINGS}/x"


async def test_the_gateways_own_fetches_and_probe_never_follow_a_redirect(
    start_proxied: StartProxied, attacker: Attacker
) -> None:
    """Discovery (aggregated and legacy), OpenAPI v3 and v2 and the availability probe all meet a
    redirect with the first-Location-empty trick; each is refused, none is followed, and the
    APIService says why."""
    proxied: Proxied = await start_proxied(force=True)
    backend = proxied.backend
    redirect = answer(302, [("Location", ""), ("Location", attacker.url)])
    for path in ("/apis", PREFIX, "/openapi/v3", "/openapi/v2"):
        backend.routes[path] = redirect
    gateway = proxied.server.gateway
    gateway.control.availability.poke(APISERVICE)
    gateway.control.discovery.fetcher.poke(APISERVICE)
    await until(lambda: getattr(gateway.control.availability.verdict(APISERVICE), "reason", "") == REDIRECT_REJECTED)
    verdict = gateway.control.availability.verdict(APISERVICE)
    assert verdict is not None and verdict.status == "False"
    assert "bad status from" in verdict.message and "[hop: redirect;" in verdict.message
    assert "redirects are not followed" in verdict.message

    state = gateway.control.discovery.fetcher.states[APISERVICE]
    await until(lambda: REDIRECT_MESSAGE in state.last_error)
    assert state.last_error == f"GET /apis: 302: {REDIRECT_MESSAGE}"
    await until(
        lambda: {r.raw_path for r in backend.received} >= {"/apis", PREFIX, "/openapi/v3", "/openapi/v2"}
    )

    async with proxied.request("GET", "/openapi/v3", allow_redirects=False) as resp:
        assert resp.status == 200
        assert f"apis/{GROUP}/{VERSION}" not in (await resp.json())["paths"]
    for path in ("/apis", f"/apis/{GROUP}", "/openapi/v2"):
        async with proxied.request("GET", path, allow_redirects=False) as resp:
            assert "Location" not in resp.headers, path
    assert attacker.connections == 0


async def test_upgrade_redirects_are_not_relayed(start_proxied: StartProxied, attacker: Attacker) -> None:
    proxied = await start_proxied()
    proxied.backend.routes[f"{THINGS}/x/exec"] = answer(302, [("Location", ""), ("Location", attacker.url)])
    headers = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    headers["Sec-WebSocket-Key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    async with proxied.request("GET", f"{THINGS}/x/exec", headers=headers, allow_redirects=True) as resp:
        assert resp.status == 503
        assert "Location" not in resp.headers
        assert status_of(await resp.read())["message"] == "invalid upgrade response: status code 302"
    assert attacker.connections == 0
