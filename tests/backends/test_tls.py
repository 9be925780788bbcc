"""Backend certificates whose only name is the Common Name are refused everywhere, in Go's words.

Go has ignored the Common Name since 1.15; a certificate with CN `api.demo.svc` and no subject
alternative names matches nothing. Every way to a backend (proxy, upgrade, discovery, OpenAPI,
the availability probe) and to kube-apiserver (the delegate, the kube client) must refuse it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from aggregator.backends.tls import client_context
from aggregator.kube.client import ServerTrust
from aggregator.tls.issue import KeyPair, issue_serving_cert, write_pair
from tests.conftest import StartGateway
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    force_available,
    status_of,
    write_manifests,
)
from tests.support.fakekube import GATEWAY_TOKEN, GATEWAY_USER, FakeKube, kube_options
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

LEGACY_CN = "x509: certificate relies on legacy Common Name field, use SANs instead"
TLS_CAUSE = f"tls: failed to verify certificate: {LEGACY_CN}"
THINGS = f"{PREFIX}/namespaces/default/things"


def cn_only(ca: KeyPair, name: str) -> KeyPair:
    """A serving certificate signed by `ca` whose only name is its Common Name."""
    pair = issue_serving_cert(ca, [], common_name=name)
    with pytest.raises(x509.ExtensionNotFound):
        pair.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return pair


def test_every_client_context_ignores_the_common_name() -> None:
    assert client_context(None, insecure=False, client_pair=None).hostname_checks_common_name is False
    assert ServerTrust("https://k:6443", None).new_context().hostname_checks_common_name is False


@pytest.fixture
async def cn_backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[FakeBackend]:
    write_pair(backend_pki.dir, "cn-only", cn_only(backend_pki.ca, SERVER_NAME))
    fake = FakeBackend(
        str(backend_pki.dir / "cn-only.crt"),
        str(backend_pki.dir / "cn-only.key"),
        pki.path("front-proxy-ca.crt"),
    )
    await fake.start()
    yield fake
    await fake.stop()


async def test_a_common_name_only_backend_is_refused_on_every_path(
    start_gateway: StartGateway,
    cn_backend: FakeBackend,
    backend_pki: BackendPKI,
    pki: PKI,
    apiservices_dir: Path,
) -> None:
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=cn_backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(cn_backend.port),
    )
    server = await start_gateway()
    gateway = server.gateway
    url = f"https://127.0.0.1:{cn_backend.port}"

    # The availability probe.
    await until(lambda: gateway.control.availability.verdict(APISERVICE) is not None)
    verdict = gateway.control.availability.verdict(APISERVICE)
    assert verdict is not None and verdict.reason == "FailedDiscoveryCheck"
    assert verdict.message.startswith(
        f'failing or missing response from {url}{PREFIX}: Get "{url}{PREFIX}": {TLS_CAUSE} [hop: tls; '
    )
    assert f"expected name: {SERVER_NAME}" in verdict.message
    assert "certificate names: none (no subject alternative names)" in verdict.message

    # Discovery and OpenAPI fetches.
    state = gateway.control.discovery.fetcher.states[APISERVICE]
    await until(lambda: LEGACY_CN in state.last_error)

    force_available(server)
    async with aiohttp.ClientSession() as session:
        # A proxied request.
        async with session.get(server.url + THINGS, ssl=pki.client_context()) as resp:
            assert resp.status == 503
            assert status_of(await resp.read())["message"] == f"error trying to reach service: {TLS_CAUSE}"
        # An upgrade.
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        async with session.get(
            server.url + THINGS + "/x/exec", headers=headers, ssl=pki.client_context()
        ) as resp:
            assert resp.status == 503
            assert status_of(await resp.read())["message"] == TLS_CAUSE
    # No request ever completed a handshake with it.
    assert cn_backend.received == []


async def test_a_common_name_only_kube_apiserver_is_refused_by_the_delegate(pki: PKI, tmp_path: Path) -> None:
    fake = FakeKube(tmp_path / "fake-kube")
    fake.serving = cn_only(fake.ca, "kubernetes.default.svc")
    write_pair(fake.dir, "serving", fake.serving)
    await fake.start()
    try:
        fake.add_token(GATEWAY_TOKEN, GATEWAY_USER)
        kubeconfig = fake.write_kubeconfig(
            tmp_path / "gateway.kubeconfig", token=GATEWAY_TOKEN, tls_server_name="kubernetes.default.svc"
        )
        options = kube_options(pki, kubeconfig)
        async with (
            running_gateway(options) as server,
            aiohttp.ClientSession() as session,
            session.get(server.url + "/api/v1/namespaces", ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 503
            message = status_of(await resp.read())["message"]
        assert message == f"error trying to reach service: {TLS_CAUSE}"
        # The gateway's own list/watch client never got an answer either.
        assert fake.requests == []
    finally:
        await fake.stop()
