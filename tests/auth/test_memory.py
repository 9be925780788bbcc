"""Authentication must not grow memory per request, whatever kind of caller sends it.

The common production mix: callers with ordinary client certificates while a front-proxy CA is
configured (every such certificate is first refused as a front-proxy certificate), a front proxy
asserting users in headers, bearer tokens, and anonymous health probes. A cached refusal that was
re-raised on every request once kept each request's frames alive (~5 KB per request).
"""

from __future__ import annotations

import gc
import ssl
import tracemalloc
from pathlib import Path

import aiohttp

from tests.conftest import StartGateway
from tests.support.pki import PKI

WARM_UP = 300
MEASURED = 1500
# Per request, after warm-up: caches are full, so anything left is a leak. The leak this guards
# against kept ~5000 bytes per request.
ALLOWED_BYTES_PER_REQUEST = 150


async def test_authenticated_requests_do_not_grow_memory(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('tok-carol,carol,1003,"team"\n')
    server = await start_gateway(token_auth_file=str(tokens))
    user_cert = pki.client_context("admin")  # signed by the client CA, refused as a front proxy
    proxy_cert = pki.client_context("front-proxy-client")
    anonymous = pki.client_context(None)
    callers: list[tuple[ssl.SSLContext, dict[str, str], str, int]] = [
        (user_cert, {}, "/apis", 200),
        (proxy_cert, {"X-Remote-User": "bob", "X-Remote-Group": "devs"}, "/apis", 200),
        (anonymous, {"Authorization": "Bearer tok-carol"}, "/apis", 200),
        (anonymous, {}, "/livez", 200),
    ]

    async with aiohttp.ClientSession() as session:

        async def burst(count: int) -> None:
            for i in range(count):
                context, headers, path, expected = callers[i % len(callers)]
                async with session.get(server.url + path, ssl=context, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == expected, (path, headers, resp.status)

        await burst(WARM_UP)
        gc.collect()
        tracemalloc.start(1)
        try:
            before = tracemalloc.get_traced_memory()[0]
            await burst(MEASURED)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            top = tracemalloc.take_snapshot().statistics("lineno")[:5]
        finally:
            tracemalloc.stop()
    assert grown / MEASURED < ALLOWED_BYTES_PER_REQUEST, (grown, [str(s) for s in top])
