"""A backend's answers over TLS are read through `BufferedReads`: into a buffer the size of what
is pending, not a fresh 256 KiB bytes object per TLS record (which the control process, whose
large allocations are each a mapping, paid for with three system calls per read)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aggregator.backends._aiohttp import BufferedReads
from aggregator.backends.backend import Address, Backend
from aggregator.backends.tls import client_context
from aggregator.tls.issue import issue_serving_cert, new_ca, write_pair

NAME = "api.reads.svc"
BIG = 3 * 1024 * 1024 + 17  # many TLS records, more than any buffer one read asks for


class TLSServer:
    """Answers every GET with `size` bytes of a repeating pattern, with a Content-Length or chunked."""

    def __init__(self, certs: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs / "serving.crt", certs / "serving.key")
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                target = line.split()[1].decode()
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                size = int(target.rsplit("/", 1)[1])
                body = pattern(size)
                if target.startswith("/chunked/"):
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for at in range(0, size, 70_000):
                        chunk = body[at : at + 70_000]
                        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (size, body))
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def pattern(size: int) -> bytes:
    block = bytes(range(251))  # a prime length: a misplaced or repeated buffer shows up as a mismatch
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[TLSServer, bytes]]:
    ca = new_ca("reads-ca")
    write_pair(tmp_path, "serving", issue_serving_cert(ca, [NAME]))
    server = TLSServer(tmp_path)
    await server.start()
    yield server, ca.cert_pem
    await server.stop()


async def test_answers_over_tls_arrive_whole_through_buffered_reads(tls_server: tuple[TLSServer, bytes]) -> None:
    await answers_arrive_whole(*tls_server, buffered=True)


@pytest.mark.uvloop  # the production loop, whose TLS protocol picks the buffered path by itself
@pytest.mark.parametrize("buffered", [True, False])
async def test_answers_over_tls_arrive_whole_on_uvloop(tls_server: tuple[TLSServer, bytes], buffered: bool) -> None:
    await answers_arrive_whole(*tls_server, buffered=buffered)


async def answers_arrive_whole(server: TLSServer, ca_pem: bytes, *, buffered: bool) -> None:
    context = client_context(ca_pem, insecure=False, client_pair=None)
    backend = Backend("reads", context=context, buffered_reads=buffered)
    address = Address("127.0.0.1", server.port, NAME)
    try:
        # Small and large answers, sized and chunked, one after the other on one pooled connection.
        for path, size in [("/sized", 90), ("/sized", BIG), ("/chunked", BIG), ("/sized", 0), ("/chunked", 5)]:
            response = await backend.get(address, f"{path}/{size}", lambda: [("Host", NAME)], max_body=BIG)
            assert response.status == 200
            assert len(response.body) == size
            assert response.body == pattern(size)
        idle = backend.pool._idle[("127.0.0.1", server.port, NAME)]
        assert len(idle) == 1  # every answer ended cleanly on the one connection
        handler = idle[0][0]
        assert handler.transport is not None
        assert isinstance(handler.transport.get_protocol(), BufferedReads) is buffered
    finally:
        await backend.close()
