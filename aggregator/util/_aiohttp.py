"""Every aiohttp internal the gateway relies on, in one place.

The proxy's hot path and its upgrade splice need a few things aiohttp does not publish: reading a
backend's answer with aiohttp's own C parser on a connection we manage (`ResponseHandler`),
waiting for a paused transport to drain, sending a response's headers together with its first body
bytes, and taking over a server connection's raw bytes after a `101` (the hook `WebSocketResponse`
uses). aiohttp's minor version is pinned in pyproject.toml for these; `missing_internals()` is
checked by tests/util/test_aiohttp_internals.py so an upgrade that breaks one fails loudly there,
not in production.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

__all__ = [
    "HeadersWithBody",
    "RawResponseMessage",
    "ResponseHandler",
    "StreamReader",
    "drain",
    "missing_internals",
    "response_protocol",
    "take_over_connection",
]


class RawBytesSink(Protocol):
    """What receives a server connection's bytes once it is taken over (aiohttp calls it a parser)."""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]: ...

    def feed_eof(self) -> None: ...


def response_protocol(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    """aiohttp's client protocol: the llhttp response parser feeding a StreamReader per body."""
    return ResponseHandler(loop)


def prepare_response(protocol: ResponseHandler, *, head_only: bool, read_bufsize: int, max_line: int) -> None:
    """Set up `protocol` to parse the next answer without decompressing or limiting its headers."""
    protocol.set_response_params(
        skip_payload=head_only,
        # No Content-Length and not chunked: the body runs to the end of the connection.
        read_until_eof=True,
        auto_decompress=False,
        read_bufsize=read_bufsize,
        max_line_size=max_line,
        max_field_size=max_line,
    )


async def drain(protocol: Any) -> None:
    """Wait until a paused transport (client or server side) can take more bytes."""
    if protocol.writing_paused:
        await protocol._drain_helper()


class HeadersWithBody(web.StreamResponse):
    """A response whose headers go out with its first body bytes (one TLS record for a small one).

    For answers whose body is already on its way (a Content-Length was announced); a streamed one
    such as a watch must send its headers at once and uses a plain StreamResponse.
    """

    _send_headers_immediately = False


def take_over_connection(request: web.BaseRequest, sink: RawBytesSink) -> None:
    """From now on every byte the client sends goes to `sink`, not to the HTTP parser."""
    protocol: Any = request.protocol
    protocol.set_parser(sink)


def missing_internals() -> list[str]:
    """The internals above this aiohttp no longer has (empty when all is well)."""
    missing = []
    for owner, name in (
        (ResponseHandler, "set_response_params"),
        (ResponseHandler, "read"),
        (ResponseHandler, "writing_paused"),
        (ResponseHandler, "_drain_helper"),
        (RequestHandler, "set_parser"),
        (RequestHandler, "_drain_helper"),
        (web.StreamResponse, "_send_headers_immediately"),
    ):
        if not hasattr(owner, name):
            missing.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
    return missing
