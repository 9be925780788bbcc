"""`/healthz`, `/livez`, `/readyz` in kube-apiserver's exact wire format."""

from __future__ import annotations

import aiohttp

from tests.conftest import StartGateway
from tests.support.pki import PKI


async def get(pki: PKI, url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=pki.client_context()) as resp:
        return resp.status, resp.headers["Content-Type"], await resp.text()


async def test_ok_plain_text(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    for endpoint in ("healthz", "livez", "readyz"):
        assert await get(pki, f"{server.url}/{endpoint}") == (200, "text/plain; charset=utf-8", "ok")


async def test_verbose_lists_checks(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    _, _, body = await get(pki, f"{server.url}/readyz?verbose")
    assert body == (
        "[+]ping ok\n[+]shutdown ok\n[+]apiservice-registry-synced ok\n"
        "[+]apiservice-availability-synced ok\nreadyz check passed\n"
    )
    _, _, live = await get(pki, f"{server.url}/livez?verbose")
    assert live == "[+]ping ok\nlivez check passed\n"


async def test_failing_check_is_500_with_reason_withheld(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    server.gateway.health.add("backend-thing", lambda: "secret detail")
    status, _, body = await get(pki, f"{server.url}/healthz")
    assert status == 500
    assert body == (
        "[+]ping ok\n[+]shutdown ok\n[+]apiservice-registry-synced ok\n"
        "[+]apiservice-availability-synced ok\n"
        "[-]backend-thing failed: reason withheld\nhealthz check failed\n\n"
    )
    assert "secret detail" not in body


async def test_exclude(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    server.gateway.health.add("broken", lambda: "nope")
    status, _, body = await get(pki, f"{server.url}/readyz?exclude=broken&exclude=missing&verbose")
    assert status == 200
    assert "[+]broken excluded: ok\n" in body
    assert 'warn: some health checks cannot be excluded: no matches for "missing"\n' in body


async def test_single_check_path(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    server.gateway.health.add("broken", lambda: "the reason")
    assert await get(pki, f"{server.url}/readyz/ping") == (200, "text/plain; charset=utf-8", "ok")
    status, _, body = await get(pki, f"{server.url}/readyz/broken")
    assert (status, body) == (500, "internal server error: the reason\n")
    status, _, _ = await get(pki, f"{server.url}/readyz/unknown")
    assert status == 404


async def test_readyz_fails_while_shutting_down_but_livez_does_not(
    start_gateway: StartGateway, pki: PKI
) -> None:
    server = await start_gateway()
    server.gateway.shutting_down = True
    assert (await get(pki, f"{server.url}/readyz"))[0] == 500
    assert (await get(pki, f"{server.url}/livez"))[0] == 200
