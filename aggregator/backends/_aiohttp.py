"""The aiohttp internals the backend client relies on (the server side's are in
`web/http1/server.py`); nothing else outside web/http1 imports aiohttp's private modules
(pyproject.toml's `aiohttp-internals` contract). The proxy reads a backend's answer as the types
below, and handles the parser's `HttpProcessingError` as a malformed answer.

The proxy's hot path reads a backend's answer with aiohttp's own C parser (llhttp) on a connection
it manages (`ResponseHandler`), keeps that parser between exchanges of a pooled connection
(`prepare_response`), and waits for a paused transport to drain. In the control process a TLS
transport hands that handler its records through `BufferedReads`. aiohttp's minor version is
pinned in pyproject.toml for these; `missing_internals()` is checked by
tests/backends/test_aiohttp_internals.py so an upgrade that breaks one fails loudly there, not
in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader

from aggregator.util.internals import missing_attributes

# A read buffer when the transport gives no size hint (uvloop's TLS protocol always gives one).
READ_FALLBACK = 16 * 1024
NO_BUFFER = memoryview(b"")

__all__ = [
    "BufferedReads",
    "HttpProcessingError",
    "RawResponseMessage",
    "ResponseHandler",
    "StreamReader",
    "drain",
    "missing_internals",
    "prepare_response",
    "response_protocol",
]


def response_protocol(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    """aiohttp's client protocol: the llhttp response parser feeding a StreamReader per body."""
    return ResponseHandler(loop)


class BufferedReads(asyncio.BufferedProtocol):
    """What a TLS transport is given in front of a `ResponseHandler`: decrypted bytes are read into
    a buffer sized to what is pending, not into a fresh 256 KiB bytes object per record.

    uvloop's (and asyncio's) SSL protocol hands a plain `Protocol` each record read as the slice of
    a `SSL_READ_MAX_SIZE` (256 KiB) bytes object; where glibc maps every allocation of 128 KiB or
    more (`util/memory.py`: the control process), that is an mmap, an mremap and an munmap per
    read, about 9% of an idle control's CPU at 5000 healthy backends. A `BufferedProtocol` (which
    uvloop recognises by `get_buffer` on a class that is not a `Protocol`) is asked for a buffer of
    the pending bytes plus a little instead. Everything else goes through to the handler, which
    keeps the transport (`connection_made`) and is what the pool holds. Used where large
    allocations are mapped: elsewhere glibc recycles the 256 KiB from its heap, and this adapter's
    zeroed buffer and copy would cost a large proxied body more than it saves.
    """

    __slots__ = ("_buffer", "handler")

    def __init__(self, handler: ResponseHandler) -> None:
        self.handler = handler
        self._buffer = NO_BUFFER

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.handler.connection_made(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        # A view, not the bytearray: asyncio's SSL protocol reads the rest of a record into
        # `buffer[offset:]`, which must be the same memory (a bytearray's slice is a copy).
        self._buffer = buffer = memoryview(bytearray(sizehint if sizehint > 0 else READ_FALLBACK))
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        buffer, self._buffer = self._buffer, NO_BUFFER  # an idle connection holds none
        self.handler.data_received(buffer[:nbytes].tobytes())

    def eof_received(self) -> None:
        self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


def prepare_response(protocol: ResponseHandler, *, head_only: bool, read_bufsize: int, max_line: int) -> None:
    """Set up `protocol` to parse the next answer without decompressing or limiting its headers.

    A keep-alive connection goes back to its pool only after a complete answer, where aiohttp's
    response parser stands ready for the next one (as a server's parser does between requests):
    the parser the previous exchange set up with the same settings is kept rather than built
    again for every request (about 2% of a proxied request's CPU).
    """
    settings = (head_only, read_bufsize, max_line)
    if protocol._parser is not None and getattr(protocol, "_gateway_settings", None) == settings:
        return
    protocol._gateway_settings = settings  # type: ignore[attr-defined]
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


def missing_internals() -> list[str]:
    """The internals above this aiohttp no longer has (empty when all is well)."""
    used = ("set_response_params", "read", "writing_paused", "_drain_helper", "_parser")
    return missing_attributes((ResponseHandler, name) for name in used)
