"""Explain a failed TLS connection to a backend in Go's words: names and alerts included.

Two failures hide their cause from Python's TLS stack, and both are among the most common
aggregation problems:

- a backend certificate that fails verification: OpenSSL aborts the handshake without handing over
  the certificate and says only "Hostname mismatch" or "unable to get local issuer certificate".
  On failure the gateway takes a second, unverified look at the certificate on the address it
  already dialed and reports what upstream would: `x509: certificate is valid for a.b.svc, not
  c.d.svc` (`peer_certificate` + `explain`);
- a backend that refuses the gateway's client certificate: with TLS 1.3 the server says so with
  an alert sent after the handshake, which asyncio's streams (and so aiohttp) swallow into a bare
  "EOF". A blocking read on a fresh connection brings the alert out, so the answer can name it as
  Go does: `remote error: tls: unknown certificate authority` (`alert_after_handshake`).

Everything here runs only after a failure, never on the way of a request that works.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import socket
import ssl

from cryptography import x509
from cryptography.x509.oid import NameOID

from aggregator.backends.errors import tls_alert_error

# OpenSSL X509_V_ERR_* codes that mean "no trusted issuer was found".
_UNKNOWN_AUTHORITY = frozenset({2, 18, 19, 20, 21})


def _go_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _san(cert: x509.Certificate) -> x509.SubjectAlternativeName | None:
    try:
        return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None


def certificate_names(cert: x509.Certificate) -> list[str]:
    """DNS and IP subject alternative names, in certificate order."""
    san = _san(cert)
    if san is None:
        return []
    dns = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    ips = [str(n) for n in san.get_values_for_type(x509.IPAddress)]
    return dns + ips


def _match_dns(pattern: str, host: str) -> bool:
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern == host:
        return True
    if pattern.startswith("*.") and "." in host:
        return host.split(".", 1)[1] == pattern[2:]
    return False


def hostname_error(cert: x509.Certificate, host: str) -> str | None:
    """Go's `HostnameError` text, or None when `cert` is valid for `host`."""
    san = _san(cert)
    dns = [str(n) for n in san.get_values_for_type(x509.DNSName)] if san else []
    ips = (
        [
            n
            for n in san.get_values_for_type(x509.IPAddress)
            if isinstance(n, ipaddress.IPv4Address | ipaddress.IPv6Address)
        ]
        if san
        else []
    )
    try:
        host_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        host_ip = None
    if host_ip is not None:
        if host_ip in ips:
            return None
        if not ips:
            return f"x509: cannot validate certificate for {host} because it doesn't contain any IP SANs"
        return f"x509: certificate is valid for {', '.join(str(i) for i in ips)}, not {host}"
    if any(_match_dns(p, host) for p in dns):
        return None
    if san is None:
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if cns and _match_dns(str(cns[0].value), host):
            return "x509: certificate relies on legacy Common Name field, use SANs instead"
    if not dns:
        return f"x509: certificate is not valid for any names, but wanted to match {host}"
    return f"x509: certificate is valid for {', '.join(dns)}, not {host}"


def explain(cert: x509.Certificate | None, server_name: str, verify_code: int, verify_message: str) -> str:
    """The cause Go would report, checking in Go's order: validity window, name, issuer."""
    prefix = "tls: failed to verify certificate: "
    if cert is None:
        return f"{prefix}x509: {verify_message}"
    now = dt.datetime.now(dt.UTC)
    if now > cert.not_valid_after_utc:
        return (
            f"{prefix}x509: certificate has expired or is not yet valid: current time {_go_time(now)} "
            f"is after {_go_time(cert.not_valid_after_utc)}"
        )
    if now < cert.not_valid_before_utc:
        return (
            f"{prefix}x509: certificate has expired or is not yet valid: current time {_go_time(now)} "
            f"is before {_go_time(cert.not_valid_before_utc)}"
        )
    mismatch = hostname_error(cert, server_name)
    if mismatch is not None:
        return prefix + mismatch
    if verify_code in _UNKNOWN_AUTHORITY:
        return f"{prefix}x509: certificate signed by unknown authority"
    return f"{prefix}x509: {verify_message}"


async def peer_certificate(
    ip: str, port: int, server_name: str, context: ssl.SSLContext, *, within: float = 2.0
) -> x509.Certificate | None:
    """The leaf certificate `ip:port` presents for `server_name`, without verifying it.

    `context` must not verify (it is only used to look); it should still carry the front-proxy
    client certificate, so servers that require one complete the handshake.
    """
    writer = None
    try:
        async with asyncio.timeout(within):
            _reader, writer = await asyncio.open_connection(
                ip, port, ssl=context, server_hostname=server_name
            )
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        return x509.load_der_x509_certificate(der) if der else None
    except (OSError, TimeoutError, ValueError, ssl.SSLError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def alert_after_handshake(
    ip: str, port: int, server_name: str, context: ssl.SSLContext, *, within: float = 1.0
) -> str | None:
    """The TLS alert `ip:port` sends once it has seen the client certificate, in Go's words.

    `context` should present the same client certificate as the connection that failed (it may
    verify the server or not: the handshake itself succeeded). Nothing is sent; a server that
    refuses the certificate answers the first read with its alert (`remote error: tls: bad
    certificate`). None when the server keeps the connection open (it accepted the certificate),
    closes it without an alert, or cannot be reached.
    """

    def read_alert() -> str | None:
        try:
            with (
                socket.create_connection((ip, port), timeout=within) as raw,
                context.wrap_socket(raw, server_hostname=server_name) as tls,
            ):
                tls.recv(1)
        except ssl.SSLError as err:
            # Only a real alert counts; an unexpected EOF says no more than the caller already knows.
            return tls_alert_error(err) if "ALERT" in str(err.reason or "") else None
        except OSError:
            return None
        return None

    return await asyncio.to_thread(read_alert)
