"""The aiohttp internals the gateway relies on still exist: an aiohttp upgrade that breaks one fails here."""

from __future__ import annotations

import aiohttp

from aggregator.backends._aiohttp import missing_internals


def test_every_internal_the_gateway_uses_exists() -> None:
    assert missing_internals() == [], f"aiohttp {aiohttp.__version__} lacks internals the proxy needs"
