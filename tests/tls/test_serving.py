"""Hot rotation of the serving certificate: new connections see the new pair, no restart."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from aggregator.tls.issue import issue_serving_cert, new_ca, write_cert, write_key
from aggregator.tls.serving import ServingCertificate
from aggregator.web.http2.nghttp2 import LIBRARY_ENV
from tests.conftest import StartGateway
from tests.support.h2client import negotiated_alpn
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until, until_async

pytestmark = pytest.mark.long(10)


async def served_certificate(port: int) -> x509.Certificate:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


async def wait_for_serial(port: int, serial: int, timeout: float = 10.0) -> float:
    async def served() -> bool:
        return (await served_certificate(port)).serial_number == serial

    return await until_async(served, timeout, "the new certificate served", every=0.2)


@pytest.fixture
def serving_files(pki: PKI, tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.path("serving.crt"), cert)
    shutil.copy(pki.path("serving.key"), key)
    return cert, key


async def test_replaced_pair_is_served_on_new_connections_without_restart(
    start_gateway: StartGateway, serving_files: tuple[Path, Path]
) -> None:
    cert, key = serving_files
    server = await start_gateway(tls_cert_file=str(cert), tls_private_key_file=str(key))
    original = await served_certificate(server.port)

    # An established keep-alive connection must survive the rotation.
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=ssl._create_unverified_context()
    )

    ca = new_ca("rotated-ca")
    rotated = issue_serving_cert(ca, ["localhost", "127.0.0.1"])
    write_key(key, rotated.key)
    write_cert(cert, rotated.cert)

    elapsed = await wait_for_serial(server.port, rotated.cert.serial_number)
    assert elapsed < 10
    assert original.serial_number != rotated.cert.serial_number

    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_pair_replaced_before_the_watch_starts_is_picked_up(serving_files: tuple[Path, Path]) -> None:
    """A worker reads the pair as it builds its listener and starts watching the files later (seconds
    later on a loaded machine): a rotation in between is a change, not the baseline. (Once, one of
    two workers took the rotated files as its baseline and served the old pair until restarted.)"""
    cert, key = serving_files
    serving = ServingCertificate(str(cert), str(key), client_ca_files=[], interval=0.05)
    rotated = issue_serving_cert(new_ca("rotated-ca"), ["localhost", "127.0.0.1"])
    write_key(key, rotated.key)
    write_cert(cert, rotated.cert)
    later = cert.stat().st_mtime_ns + 1_000_000_000  # as a rotation a second later leaves them
    for path in (cert, key):
        os.utime(path, ns=(later, later))
    serving.start()
    try:
        await until(
            lambda: serving.current.leaf.serial_number == rotated.cert.serial_number,
            10.0,
            "the pair written before the watch started taken in",
        )
    finally:
        await serving.stop()


async def test_key_type_change_is_served_too(
    start_gateway: StartGateway, serving_files: tuple[Path, Path]
) -> None:
    """OpenSSL keeps one certificate per key type; an RSA pair must fully replace an EC one."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    import aggregator.tls.issue as certs_module

    cert, key = serving_files
    server = await start_gateway(tls_cert_file=str(cert), tls_private_key_file=str(key))
    original_new_key = certs_module.new_key
    # Deliberately an RSA key where new_key is typed (and built) for EC: the key type change under test.
    certs_module.new_key = lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)  # type: ignore[assignment,return-value]
    try:
        ca = new_ca("rsa-ca")
        rotated = issue_serving_cert(ca, ["localhost", "127.0.0.1"])
    finally:
        certs_module.new_key = original_new_key
    write_key(key, rotated.key)
    write_cert(cert, rotated.cert)
    await wait_for_serial(server.port, rotated.cert.serial_number)


@pytest.mark.parametrize("breakage", ["half-written", "mismatched"])
async def test_broken_pair_keeps_the_old_certificate_and_logs_why(
    start_gateway: StartGateway,
    serving_files: tuple[Path, Path],
    breakage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert, key = serving_files
    server = await start_gateway(tls_cert_file=str(cert), tls_private_key_file=str(key))
    original = await served_certificate(server.port)
    rotated = issue_serving_cert(new_ca("other"), ["localhost"])
    caplog.set_level(logging.WARNING, logger="aggregator.tls.serving")
    if breakage == "half-written":
        pem = rotated.cert_pem
        cert.write_bytes(pem[: len(pem) // 2])
    else:
        write_cert(cert, rotated.cert)  # new certificate, old key
    await until(lambda: any("not reloaded" in r.getMessage() for r in caplog.records), what="the refused reload")
    assert (await served_certificate(server.port)).serial_number == original.serial_number
    messages = [r for r in caplog.records if "not reloaded" in r.getMessage()]
    reason = fields_of(messages[-1])["reason"]
    expected = "no valid PEM certificate" if breakage == "half-written" else "does not match the certificate"
    assert expected in reason
    # Once the pair is whole again it is picked up.
    write_key(key, rotated.key)
    write_cert(cert, rotated.cert)
    await wait_for_serial(server.port, rotated.cert.serial_number)


async def test_only_tls_1_2_and_above(start_gateway: StartGateway) -> None:
    server = await start_gateway()
    ctx = ssl._create_unverified_context()
    # Configuring an old client is deprecated in the ssl module: exactly what this test needs.
    with pytest.warns(DeprecationWarning):
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.minimum_version = ssl.TLSVersion.TLSv1
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx)


async def negotiated(port: int, offered: list[str] | None) -> str | None:
    chosen, _ = await negotiated_alpn(port, ssl._create_unverified_context(), offered)
    return chosen


async def test_offers_h2_and_http_1_1_as_kube_apiserver(start_gateway: StartGateway) -> None:
    server = await start_gateway()
    assert await negotiated(server.port, ["h2", "http/1.1"]) == "h2"
    assert await negotiated(server.port, ["http/1.1", "h2"]) == "h2"  # the server's preference
    assert await negotiated(server.port, ["http/1.1"]) == "http/1.1"
    assert await negotiated(server.port, None) is None  # no ALPN: HTTP/1.1, as before


async def test_disable_http2_serving_offers_http_1_1_only(start_gateway: StartGateway) -> None:
    server = await start_gateway(disable_http2_serving=True)
    assert await negotiated(server.port, ["h2", "http/1.1"]) == "http/1.1"


async def test_a_reloaded_pair_keeps_the_tls_policy(
    start_gateway: StartGateway, serving_files: tuple[Path, Path]
) -> None:
    """The context built for the new pair carries the same minimum version and cipher list."""
    cert, key = serving_files
    server = await start_gateway(
        tls_cert_file=str(cert),
        tls_private_key_file=str(key),
        tls_cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
    )
    rotated = issue_serving_cert(new_ca("rotated-ca"), ["localhost", "127.0.0.1"])
    write_key(key, rotated.key)
    write_cert(cert, rotated.cert)
    await wait_for_serial(server.port, rotated.cert.serial_number)

    def tls12_offering(openssl_name: str) -> ssl.SSLContext:
        ctx = ssl._create_unverified_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(openssl_name)
        return ctx

    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=tls12_offering("ECDHE-ECDSA-AES256-GCM-SHA384")
        )
    _reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=tls12_offering("ECDHE-ECDSA-AES128-GCM-SHA256")
    )
    sslobj = writer.get_extra_info("ssl_object")
    assert sslobj.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    # The rotated pair is the one presented on this very connection.
    der = sslobj.getpeercert(binary_form=True)
    assert x509.load_der_x509_certificate(der).serial_number == rotated.cert.serial_number
    writer.close()
    await writer.wait_closed()


async def test_without_libnghttp2_http_1_1_only_and_the_log_says_why(
    start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A machine without libnghttp2 still serves, over HTTP/1.1 (clients fall back to it), and the
    start-up log names the library and how to install it."""
    monkeypatch.setenv(LIBRARY_ENV, "/nonexistent/libnghttp2.so.14")
    server = await start_gateway()
    assert server.http2 is None
    assert await negotiated(server.port, ["h2", "http/1.1"]) == "http/1.1"
    warning = next(r for r in caplog.records if r.getMessage() == "HTTP/2 is not served: clients will use HTTP/1.1")
    assert "/nonexistent/libnghttp2.so.14" in fields_of(warning)["reason"]
    assert "libnghttp2-14" in fields_of(warning)["fix"]
