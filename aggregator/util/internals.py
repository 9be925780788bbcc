"""Which private attributes a pinned library no longer has.

The HTTP/1.1 server (`web/http1/`) and the backends' client (`backends/_aiohttp.py`) reach into
aiohttp's private classes for speed; each lists what it touches, and a test asserts the list is
all there, so an aiohttp upgrade that moves one fails that test by name instead of a request.
"""

from __future__ import annotations

from collections.abc import Iterable


def missing_attributes(wanted: Iterable[tuple[type, str]]) -> list[str]:
    """`module.Class.name` of each (class, attribute name) the class lacks; empty when all is there."""
    return [
        f"{owner.__module__}.{owner.__qualname__}.{name}"
        for owner, name in wanted
        if not hasattr(owner, name)
    ]
