"""Which collects request headers, the compiled callback or Python, is the install's (a compiler
builds `_h2blocks`) or `AGGREGATOR_HTTP2_COMPILED`'s choice, and the gateway says which at start.
The defences run on both (`header_collector` in test_defences.py and test_malformed.py)."""

from __future__ import annotations

import logging

import pytest

from aggregator.web.http2 import nghttp2
from tests.support.backend import PREFIX
from tests.support.fixtures import StartProxied
from tests.support.h2client import RawH2
from tests.support.pki import PKI

pytestmark = pytest.mark.usefixtures("header_collector")

THINGS = f"{PREFIX}/namespaces/default/things"


def test_the_install_built_the_compiled_header_callback() -> None:
    """This machine has a compiler and Python's headers: `make .venv/.installed-stamp` built it."""
    binding, why = nghttp2.load(compiled=True)
    assert binding is not None and binding.compiled is not None, why


async def test_the_gateway_says_which_collector_serves_and_serves_with_it(
    start_proxied: StartProxied, pki: PKI, header_collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="aggregator.runners.server"):
        proxied = await start_proxied()
    (line,) = [r for r in caplog.records if r.getMessage() == "HTTP/2 served by libnghttp2"]
    where = "C" if header_collector == "compiled" else "Python"
    assert f"header blocks collected in {where}" in line.__dict__["fields"]["detail"]
    # Fields of every length from 0 to 300 bytes, one repeated: each reaches the backend, in order.
    headers = [(f"x-field-{n}", "v" * (n * 7)) for n in range(44)] + [("x-field-1", "again")]
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        for stream in (1, 3, 5):  # one at a time: each block collected after the one before was taken
            client.send(client.headers(stream, block=client.block("GET", THINGS, headers)))
            await client.until(lambda: stream in client.ended)  # noqa: B023 (awaited here, in this iteration)
            assert client.statuses[stream] == 200
    seen = proxied.backend.seen_by("admin")
    assert [r.raw_path for r in seen] == [THINGS] * 3
    for request in seen:
        forwarded = [(k.lower(), v) for k, v in request.headers if k.lower().startswith("x-field-")]
        assert forwarded == headers
