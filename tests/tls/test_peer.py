"""Client certificates are requested but judged by the application, not by the handshake."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from aggregator.tls.issue import issue_client_cert, new_ca, write_pair
from tests.conftest import StartGateway
from tests.support.pki import PKI


async def test_certificate_from_unknown_ca_completes_the_handshake(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    """A stranger's certificate must reach the authenticator and get upstream's 401, not a TLS alert."""
    write_pair(tmp_path, "stranger", issue_client_cert(new_ca("stranger-ca"), "mallory"))
    server = await start_gateway()
    assert server.serving.verifies_in_app
    ctx = ssl.create_default_context(cafile=pki.path("ca.crt"))
    ctx.load_cert_chain(str(tmp_path / "stranger.crt"), str(tmp_path / "stranger.key"))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=ctx, server_hostname="localhost"
    )
    writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    response = await reader.read()
    assert response.startswith(b"HTTP/1.1 401")
    assert response.endswith(
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
        b'"reason":"Unauthorized","code":401}\n'
    )
    writer.close()
