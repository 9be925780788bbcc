"""`aggregator_certificate_expiration_seconds`: values, and the wiring the certificate loaders take.

The loaders are not changed here; these tests drive the hooks they already have (CAFile's
`on_change`, ProxyClientCertificate's listeners) the way the composition root is to wire them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from aggregator.backends.client_cert import ProxyClientCertificate
from aggregator.tls.issue import issue_client_cert, new_ca, write_cert, write_pair
from aggregator.tls.pem import PEMError
from aggregator.tls.verify import CAFile
from aggregator.web.certexpiry import CLIENT_CA, PROXY_CLIENT, SERVING, CertificateExpiry
from tests.conftest import StartGateway
from tests.support.pki import PKI
from tests.support.polling import until


def test_the_value_is_the_earliest_not_after_in_the_file() -> None:
    short, long = new_ca("old-ca", days=30), new_ca("new-ca", days=3650)
    expiry = CertificateExpiry()
    expiry.set_pem(CLIENT_CA, "/etc/ca/bundle.crt", long.cert_pem + short.cert_pem)
    assert expiry.value(CLIENT_CA) == ("/etc/ca/bundle.crt", short.cert.not_valid_after_utc.timestamp())


def test_a_reload_replaces_the_series_and_forget_removes_it() -> None:
    old, new = new_ca("a", days=10), new_ca("b", days=20)
    expiry = CertificateExpiry()
    expiry.set_pem(SERVING, "/old/tls.crt", old.cert_pem)
    expiry.set_pem(SERVING, "/new/tls.crt", new.cert_pem)
    (family,) = list(expiry.collect())
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"certificate": "serving", "source": "/new/tls.crt"}, new.cert.not_valid_after_utc.timestamp())
    ]
    expiry.forget(SERVING)
    assert expiry.value(SERVING) is None


def test_unparseable_pem_is_refused_like_the_loaders_refuse_it() -> None:
    with pytest.raises(PEMError):
        CertificateExpiry().set_pem(SERVING, "/x.crt", b"not a certificate")


def test_a_ca_file_reports_at_start_and_on_every_reload(tmp_path: Path) -> None:
    first, second = new_ca("ca-1", days=100), new_ca("ca-2", days=200)
    path = tmp_path / "client-ca.crt"
    write_cert(path, first.cert)
    expiry = CertificateExpiry()
    ca = CAFile(str(path), on_change=lambda pool: expiry.set_certificates(CLIENT_CA, str(path), pool.anchors))
    expiry.set_certificates(CLIENT_CA, str(path), ca.pool.anchors)  # the file as loaded at start
    assert expiry.value(CLIENT_CA) == (str(path), first.cert.not_valid_after_utc.timestamp())
    write_cert(path, second.cert)
    ca.reload()
    assert expiry.value(CLIENT_CA) == (str(path), second.cert.not_valid_after_utc.timestamp())


def test_the_proxy_client_certificate_reports_through_its_listener(tmp_path: Path) -> None:
    ca = new_ca("front-proxy-ca")
    first = issue_client_cert(ca, "front-proxy-client", days=10)
    write_pair(tmp_path, "proxy", first)
    cert_file, key_file = str(tmp_path / "proxy.crt"), str(tmp_path / "proxy.key")
    proxy = ProxyClientCertificate(cert_file, key_file)
    expiry = CertificateExpiry()

    def report() -> None:
        if proxy.pair is not None:
            expiry.set_pem(PROXY_CLIENT, cert_file, proxy.pair.cert_pem)

    proxy.add_listener(report)
    report()
    assert expiry.value(PROXY_CLIENT) == (cert_file, first.cert.not_valid_after_utc.timestamp())
    renewed = issue_client_cert(ca, "front-proxy-client", days=90)
    write_pair(tmp_path, "proxy", renewed)
    proxy.reload()
    assert expiry.value(PROXY_CLIENT) == (cert_file, renewed.cert.not_valid_after_utc.timestamp())


async def test_the_running_gateway_reports_its_proxy_client_certificate(
    start_gateway: StartGateway, pki: PKI
) -> None:
    server = await start_gateway()
    cert_file = pki.path("front-proxy-client.crt")
    with open(cert_file, "rb") as handle:
        leaf = x509.load_pem_x509_certificate(handle.read())
    value = server.gateway.metrics.registry.get_sample_value(
        "aggregator_certificate_expiration_seconds", {"certificate": "proxy-client", "source": cert_file}
    )
    assert value == leaf.not_valid_after_utc.timestamp()


async def test_metrics_show_every_certificate_and_follow_a_ca_rotation(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    """What an operator's alert reads: all four series on /metrics, the CA one moving when the file does."""
    client_ca = tmp_path / "client-ca.crt"
    shutil.copy(pki.path("client-ca.crt"), client_ca)
    server = await start_gateway(client_ca_file=str(client_ca))

    async def scrape() -> dict[tuple[str, str], float]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/metrics", ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 200
            text = await resp.text()
        family = next(f for f in text_string_to_metric_families(text) if f.name == CertificateExpiry.NAME)
        return {(s.labels["certificate"], s.labels["source"]): s.value for s in family.samples}

    def not_after(path: str | Path) -> float:
        return min(c.not_valid_after_utc.timestamp() for c in x509.load_pem_x509_certificates(Path(path).read_bytes()))

    assert await scrape() == {
        ("serving", pki.path("serving.crt")): not_after(pki.path("serving.crt")),
        ("proxy-client", pki.path("front-proxy-client.crt")): not_after(pki.path("front-proxy-client.crt")),
        ("client-ca", str(client_ca)): not_after(client_ca),
        ("requestheader-client-ca", pki.path("front-proxy-ca.crt")): not_after(pki.path("front-proxy-ca.crt")),
    }

    # mid-rotation bundle: the old CA and a new one that expires sooner; the earliest counts
    sooner = new_ca("client-ca-next", days=30)
    client_ca.write_bytes(client_ca.read_bytes() + sooner.cert_pem)
    expected = sooner.cert.not_valid_after_utc.timestamp()
    registry = server.gateway.metrics.registry
    labels = {"certificate": "client-ca", "source": str(client_ca)}
    await until(lambda: registry.get_sample_value(CertificateExpiry.NAME, labels) == expected, what="the reload")
    assert (await scrape())[("client-ca", str(client_ca))] == expected
