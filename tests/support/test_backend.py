"""The fake extension API server itself: a stopped `FakeBackend` answers nothing, over any connection.

Tests that take a backend down (discovery goes Stale, availability fails, the proxy answers 503)
rely on it: a backend that still answered on one connection after `stop()` made
tests/discovery/test_kube_mode.py's backend-down test fail about once in five runs under load.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from tests.support.backend import SERVER_NAME, BackendPKI, FakeBackend
from tests.support.fixtures import backend_pki  # noqa: F401 - fixture

REQUEST = f"GET /apis HTTP/1.1\r\nHost: {SERVER_NAME}\r\n\r\n".encode()


class TLSClient:
    """A TLS client driven one flight at a time, so that a test can act between two of them."""

    def __init__(self, sock: socket.socket) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_3  # the client finishes before the server does
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=SERVER_NAME)

    async def handshake_but_the_last_flight(self) -> None:
        """ClientHello out, the server's flight in: the server has accepted the connection and waits
        for the client's Finished, which stays here until `send`."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                await loop.sock_sendall(self.sock, self.outgoing.read())
                data = await loop.sock_recv(self.sock, 65536)
                assert data, "the backend closed the connection during the handshake"
                self.incoming.write(data)

    async def send(self, plaintext: bytes) -> None:
        self.tls.write(plaintext)
        await asyncio.get_running_loop().sock_sendall(self.sock, self.outgoing.read())

    async def answer(self) -> bytes:
        """Whatever plaintext arrives until the head of an answer, the end of the connection or a reset."""
        loop = asyncio.get_running_loop()
        plaintext = b""
        while b"\r\n\r\n" not in plaintext:
            try:
                data = await loop.sock_recv(self.sock, 65536)
            except ConnectionResetError:
                break
            if not data:
                break
            self.incoming.write(data)
            try:
                while chunk := self.tls.read(65536):
                    plaintext += chunk
            except ssl.SSLWantReadError:
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
        return plaintext


async def test_a_connection_still_in_its_tls_handshake_when_the_backend_stops_is_cut_not_served(
    backend_pki: BackendPKI,  # noqa: F811
) -> None:
    cert, key = backend_pki.serving("stopping", [SERVER_NAME])
    backend = FakeBackend(cert, key, "", require_client_cert=False)
    await backend.start()
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (backend.host, backend.port))
            client = TLSClient(sock)
            async with asyncio.timeout(30):  # a guard against a hang, never reached when passing
                await client.handshake_but_the_last_flight()
                await backend.stop()
                # aiohttp's cleanup closed the connections it knew, the ones past their handshake;
                # this one finishes its handshake now and asks
                await client.send(REQUEST)
                answer = await client.answer()
        finally:
            await backend.stop()
    assert answer == b"", f"a stopped backend answered: {answer[:80]!r}"
    assert backend.received == []
