"""The aiohttp server internals the HTTP/1.1 side uses still exist: an aiohttp upgrade that breaks
one fails here."""

from __future__ import annotations

import aiohttp

from aggregator.web.http1.server import missing_internals


def test_every_server_internal_the_gateway_uses_exists() -> None:
    assert missing_internals() == [], f"aiohttp {aiohttp.__version__} lacks internals the server needs"
