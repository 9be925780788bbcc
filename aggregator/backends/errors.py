"""Failures on the way to a backend, named by the hop that failed and worded like Go's errors.

Upstream's messages (`dial tcp 10.0.0.5:443: connect: connection refused`, `tls: failed to verify
certificate: x509: ...`) are what operators search for, so the causes are rendered the same way.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import ssl

import aiohttp
from cryptography import x509


class Hop(enum.StrEnum):
    """Where the way to a backend broke (also the `kind` label of `aggregator_backend_errors`)."""

    SERVICE = "service"  # Service missing, wrong type, no cluster IP, ExternalName refused
    PORT = "port"  # no Service port equal to spec.service.port
    ENDPOINTS = "endpoints"  # no ready EndpointSlice endpoint
    DENY_CIDR = "deny-cidr"  # the address is in --backend-deny-cidrs
    TRANSPORT = "transport"  # the TLS settings could not be built (bad caBundle)
    CONNECT = "connect"  # DNS, TCP connect, connection reset
    TLS = "tls"  # handshake or certificate verification
    TIMEOUT = "timeout"  # the request's deadline passed
    REDIRECT = "redirect"  # a 3xx other than 304 (`wire/redirects.py`; fetch returns it, callers refuse it)


class BackendError(Exception):
    """A backend could not be reached.

    `hop` says where, `cause` is the Go-style message upstream would put after `error trying to
    reach service: `, and `url` is what was dialed (empty when resolution failed). `str()` names
    the request and the cause: `Get "https://10.0.0.5:443/apis/g/v": dial tcp ...`. A failed
    certificate verification carries the certificate the backend presented (`certificate`, read
    in a second, unverified look), for reports that show the names it holds.
    """

    def __init__(
        self,
        hop: Hop,
        cause: str,
        *,
        url: str = "",
        method: str = "GET",
        verification: bool = False,
        certificate: x509.Certificate | None = None,
    ) -> None:
        super().__init__(cause)
        self.hop = hop
        self.cause = cause
        self.url = url
        self.method = method
        # The backend's certificate did not verify (`certificate`: what it presented, if readable).
        self.verification = verification
        self.certificate = certificate

    def at(self, url: str) -> BackendError:
        """This failure, as met while requesting `url`."""
        return BackendError(
            self.hop,
            self.cause,
            url=url,
            method=self.method,
            verification=self.verification,
            certificate=self.certificate,
        )

    def __str__(self) -> str:
        if self.url:
            return f'{self.method.capitalize()} "{self.url}": {self.cause}'
        return self.cause


# OpenSSL alert reasons -> Go's alert strings (crypto/tls alert.go).
_ALERTS = {
    "BAD_CERTIFICATE": "bad certificate",
    "CERTIFICATE_REQUIRED": "certificate required",
    "UNKNOWN_CA": "unknown certificate authority",
    "HANDSHAKE_FAILURE": "handshake failure",
    "CERTIFICATE_EXPIRED": "expired certificate",
    "CERTIFICATE_REVOKED": "revoked certificate",
    "CERTIFICATE_UNKNOWN": "unknown certificate",
    "UNSUPPORTED_CERTIFICATE": "unsupported certificate",
    "PROTOCOL_VERSION": "protocol version not supported",
    "ACCESS_DENIED": "access denied",
    "DECRYPT_ERROR": "error decrypting message",
    "INTERNAL_ERROR": "internal error",
    "NO_APPLICATION_PROTOCOL": "no application protocol",
}


def dial_error(authority: str, err: OSError) -> str:
    """`dial tcp <host:port>: connect: connection refused` (Go's net.OpError text)."""
    code = err.errno
    if isinstance(err, TimeoutError) or code == errno.ETIMEDOUT:
        return f"dial tcp {authority}: i/o timeout"
    if code is not None and code > 0:
        return f"dial tcp {authority}: connect: {os.strerror(code).lower()}"
    return f"dial tcp {authority}: {err.strerror or err}"


def tls_alert_error(err: ssl.SSLError) -> str:
    """A handshake failure that is not our verification: `remote error: tls: bad certificate`."""
    reason = str(getattr(err, "reason", "") or "")
    for prefix in ("SSLV3_ALERT_", "TLSV1_ALERT_", "TLSV13_ALERT_"):
        if reason.startswith(prefix):
            alert = reason[len(prefix) :]
            return f"remote error: tls: {_ALERTS.get(alert, alert.lower().replace('_', ' '))}"
    if reason:
        return f"tls: {reason.lower().replace('_', ' ')}"
    return f"tls: {err}"


def classify(err: BaseException, authority: str) -> tuple[Hop, str]:
    """Map an aiohttp/OS/SSL exception raised while reaching `authority` to (hop, Go-style cause).

    Certificate verification failures are refined by `tlsdiag` (which can see the certificate);
    this gives the fallback wording.
    """
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        cert_err = err.certificate_error
        message = getattr(cert_err, "verify_message", "") or str(cert_err)
        return Hop.TLS, f"tls: failed to verify certificate: x509: {message}"
    if isinstance(err, aiohttp.ClientConnectorSSLError | aiohttp.ClientSSLError):
        inner = err.os_error
        return Hop.TLS, tls_alert_error(inner) if isinstance(inner, ssl.SSLError) else f"tls: {inner}"
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        return Hop.CONNECT, f"dial tcp {authority}: i/o timeout"
    if isinstance(err, aiohttp.ClientConnectorDNSError):
        host = authority.rsplit(":", 1)[0]
        return Hop.CONNECT, f"dial tcp: lookup {host}: no such host"
    if isinstance(err, aiohttp.ClientConnectorError):
        return Hop.CONNECT, dial_error(authority, err.os_error)
    if isinstance(err, ssl.SSLError):
        return Hop.TLS, tls_alert_error(err)
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return Hop.CONNECT, "EOF"
    if isinstance(err, aiohttp.ClientOSError) and isinstance(err.__cause__, ssl.SSLError):
        return Hop.TLS, tls_alert_error(err.__cause__)
    if isinstance(err, aiohttp.SocketTimeoutError | asyncio.TimeoutError | TimeoutError):
        return Hop.TIMEOUT, "context deadline exceeded"
    if isinstance(err, ConnectionResetError) or (isinstance(err, OSError) and err.errno == errno.ECONNRESET):
        return Hop.CONNECT, f"read tcp {authority}: read: connection reset by peer"
    if isinstance(err, OSError):
        return Hop.CONNECT, dial_error(authority, err)
    return Hop.CONNECT, str(err) or type(err).__name__
