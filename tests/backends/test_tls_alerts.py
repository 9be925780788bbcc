"""A backend that refuses the gateway's client certificate: the 503 names the TLS alert, as Go's does.

With TLS 1.3 the refusal comes as an alert after the handshake, which Python's TLS streams report
as a closed connection ("EOF"). The proxy asks again on the failure path only and answers with
Go's words (`remote error: tls: unknown certificate authority`), on ordinary requests, upgrades
and the gateway's own fetches alike.

The backend (`LostAlertBackend`) plays what a loaded gateway sees from a Go server: the reset that
follows the alert overtakes it, or the server's clean close arrives without it. The tests run on
uvloop, the gateway's production loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from aggregator.backends.backend import ALERT_TTL, Address, Backend
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.tls import client_context
from aggregator.model.userinfo import AGGREGATOR
from aggregator.runners.server import GatewayServer
from aggregator.tls.pem import read_pair
from tests.conftest import StartGateway
from tests.support.backend import (
    PREFIX,
    SERVER_NAME,
    BackendPKI,
    LostAlertBackend,
    apiservice_manifest,
    backend_service,
    force_available,
    status_of,
    write_manifests,
)
from tests.support.pki import PKI

THINGS = f"{PREFIX}/namespaces/default/things"
ALERT = "remote error: tls: unknown certificate authority"

pytestmark = pytest.mark.uvloop


@pytest.fixture(params=["reset", "eof"])
def alerting(backend_pki: BackendPKI, request: pytest.FixtureRequest) -> Iterator[LostAlertBackend]:
    """An extension server whose front-proxy CA is not the one that signed the gateway's certificate."""
    other = backend_pki.dir / "alerting-front-proxy-ca.crt"
    other.write_bytes(backend_pki.other_ca.cert_pem)
    cert, key = backend_pki.serving("alerting-proxy", [SERVER_NAME])
    backend = LostAlertBackend(cert, key, str(other), lost=request.param)
    yield backend
    backend.close()


async def gateway_for(
    start_gateway: StartGateway, apiservices_dir: Path, backend_pki: BackendPKI, port: int
) -> GatewayServer:
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(port),
    )
    server: GatewayServer = await start_gateway()
    # The availability checker would answer 503 `service unavailable` first; the proxy's own
    # answer is what this is about.
    force_available(server)
    return server


async def test_refused_client_certificate_names_the_alert(
    start_gateway: StartGateway,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
    pki: PKI,
    alerting: LostAlertBackend,
) -> None:
    server = await gateway_for(start_gateway, apiservices_dir, backend_pki, alerting.port)
    async with aiohttp.ClientSession() as session:
        for path in (THINGS, PREFIX):  # a resource request, and a (5 s bounded) discovery request
            async with session.get(server.url + path, ssl=pki.client_context()) as resp:
                assert resp.status == 503
                body = status_of(await resp.read())
            assert body["message"] == f"error trying to reach service: {ALERT}"
            assert body["reason"] == "ServiceUnavailable"
    errors = server.gateway.metrics.registry.get_sample_value(
        "aggregator_backend_errors_total", {"apiservice": "v1.demo.example.com", "kind": "tls"}
    )
    assert errors is not None and errors >= 2.0  # the two above (discovery and OpenAPI fetches count too)
    assert alerting.alerts_lost >= 2 and alerting.alerts_sent >= 1


async def test_refused_client_certificate_on_an_upgrade_names_the_alert(
    start_gateway: StartGateway,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
    pki: PKI,
    alerting: LostAlertBackend,
) -> None:
    server = await gateway_for(start_gateway, apiservices_dir, backend_pki, alerting.port)
    host, port = "127.0.0.1", server.port
    reader, writer = await asyncio.open_connection(host, port, ssl=pki.client_context(), server_hostname=host)
    try:
        writer.write(
            f"GET {PREFIX}/namespaces/default/pods/p/exec HTTP/1.1\r\nHost: {host}\r\n"
            "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 503 ")
        body = await asyncio.wait_for(reader.read(), 10)  # the connection is closed after the answer
    finally:
        writer.close()
    # Upstream's upgrade responder: the error itself, no "error trying to reach service" prefix.
    assert status_of(body)["message"] == ALERT


async def test_the_gateways_own_fetches_name_the_alert(
    start_gateway: StartGateway,
    apiservices_dir: Path,
    backend_pki: BackendPKI,
    alerting: LostAlertBackend,
) -> None:
    """Discovery and OpenAPI downloads (`Backends.fetch`) report the same cause."""
    server = await gateway_for(start_gateway, apiservices_dir, backend_pki, alerting.port)
    gateway = server.gateway
    svc = gateway.store.apiservice("v1.demo.example.com")
    assert svc is not None
    with pytest.raises(BackendError) as caught:
        await gateway.backends.fetch(svc, PREFIX, headers={}, user=AGGREGATOR, timeout=5)
    assert (caught.value.hop, caught.value.cause) == (Hop.TLS, ALERT)
    assert str(caught.value) == f'Get "https://127.0.0.1:{alerting.port}{PREFIX}": {ALERT}'


async def test_failures_close_together_share_one_look(
    backend_pki: BackendPKI, pki: PKI, alerting: LostAlertBackend
) -> None:
    """A broken backend under load gets one extra connection per ALERT_TTL, not one per request."""
    pair = read_pair(pki.path("front-proxy-client.crt"), pki.path("front-proxy-client.key"))
    context = client_context(backend_pki.ca.cert_pem, insecure=False, client_pair=pair)
    backend = Backend("alerting", context=context, client_pair=pair)
    answers = await asyncio.gather(
        *(backend.diagnose(Hop.CONNECT, "EOF", Address("127.0.0.1", alerting.port, SERVER_NAME)) for _ in range(20))
    )
    assert set(answers) == {(Hop.TLS, ALERT)}
    await asyncio.sleep(0.1)  # the backend counts an alert after sending it; a second must not come
    assert alerting.alerts_sent == 1
    # Other failures are left as they are, without a look.
    refused = await backend.diagnose(
        Hop.CONNECT, "dial tcp 127.0.0.1:1: connect: connection refused", Address("127.0.0.1", 1, SERVER_NAME)
    )
    assert refused == (Hop.CONNECT, "dial tcp 127.0.0.1:1: connect: connection refused")
    assert alerting.alerts_sent == 1
    assert ALERT_TTL >= 1.0
