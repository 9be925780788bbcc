"""TLS client contexts for backends: which CAs are trusted, which certificate is presented.

Every backend context speaks TLS >= 1.2 and HTTP/1.1 only (upgrades need HTTP/1.1, and the lean
client speaks nothing else), and matches names against subject alternative names only: a
certificate whose only name is its Common Name matches nothing, as Go has had it since 1.15
(`x509: certificate relies on legacy Common Name field, use SANs instead`, the words `tlsdiag`
reports). A context is built from `TLSSettings`; equal settings share one context and one
connection pool.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from aggregator.tls.pem import CertKeyPair, PEMError, load_pair_into, parse_certificates

# Upstream's transport-building error for a caBundle without a certificate.
INVALID_CA = "unable to load root certificates: unable to parse bytes as PEM block"


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """Everything a backend's SSLContext is built from; equal settings share a context.

    The name a certificate must hold is not part of it: it is given per connection
    (`server_hostname`), so every APIService trusting the same caBundle shares one context.
    """

    ca_bundle: bytes
    insecure: bool
    cert_generation: int


def client_context(
    ca_pem: bytes | None, *, insecure: bool, client_pair: CertKeyPair | None, verify: bool = True
) -> ssl.SSLContext:
    """A TLS >= 1.2, HTTP/1.1 client context; `ca_pem` None or empty means the system roots.

    Raises PEMError with upstream's message when the CA bundle holds no certificate.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.hostname_checks_common_name = False
    if insecure or not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_pem:
        try:
            parse_certificates(ca_pem, source="caBundle")
            ctx.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
        except (PEMError, ssl.SSLError) as err:
            raise PEMError(INVALID_CA) from err
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if client_pair is not None:
        load_pair_into(ctx, client_pair)
    return ctx


def harden(context: ssl.SSLContext) -> None:
    """HTTP/1.1 only, TLS >= 1.2 and no Common Name matching, whatever the library that built
    `context` set."""
    context.set_alpn_protocols(["http/1.1"])
    context.hostname_checks_common_name = False
    if context.minimum_version < ssl.TLSVersion.TLSv1_2:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
