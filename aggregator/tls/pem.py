"""Load and check PEM material before it reaches an SSLContext.

OpenSSL loads a certificate and its key in two steps, so a mismatched pair can leave a context
half-updated. Everything is parsed and matched here first, and contexts are then loaded from the
exact bytes that were checked (no second read of a file that may be mid-write).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization


class PEMError(ValueError):
    """Unusable certificate or key material; the message says why."""


@dataclass(frozen=True)
class CertKeyPair:
    cert_pem: bytes
    key_pem: bytes
    leaf: x509.Certificate

    @property
    def not_after(self) -> float:
        return self.leaf.not_valid_after_utc.timestamp()

    def same_as(self, other: CertKeyPair | None) -> bool:
        """The same certificate and key as `other` (a reload that changed nothing)."""
        return other is not None and self.cert_pem == other.cert_pem and self.key_pem == other.key_pem

    def described(self) -> dict[str, str]:
        """What a log line says of the certificate (a reload's): its subject and its expiry."""
        return {
            "subject": self.leaf.subject.rfc4514_string(),
            "not_after": self.leaf.not_valid_after_utc.isoformat(),
        }


def parse_certificates(data: bytes, *, source: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as err:
        raise PEMError(f"{source}: no valid PEM certificate ({err})") from err
    if not certs:
        raise PEMError(f"{source}: no PEM certificate found")
    return certs


def parse_pair(cert_pem: bytes, key_pem: bytes, *, cert_source: str, key_source: str) -> CertKeyPair:
    """Check that the key parses and belongs to the first certificate."""
    certs = parse_certificates(cert_pem, source=cert_source)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise PEMError(f"{key_source}: not a usable unencrypted PEM private key") from err
    leaf_public = (
        certs[0]
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    key_public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if leaf_public != key_public:
        raise PEMError(f"{key_source}: private key does not match the certificate in {cert_source}")
    return CertKeyPair(cert_pem, key_pem, certs[0])


def read_pair(cert_file: str | Path, key_file: str | Path) -> CertKeyPair:
    try:
        cert_pem = Path(cert_file).read_bytes()
        key_pem = Path(key_file).read_bytes()
    except OSError as err:
        raise PEMError(f"{err.filename}: {err.strerror}") from err
    return parse_pair(cert_pem, key_pem, cert_source=str(cert_file), key_source=str(key_file))


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path whose content is `data`, never written to a disk when the platform allows it."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("aggregator-pem", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pair.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        yield str(path)


def load_pair_into(ctx: ssl.SSLContext, pair: CertKeyPair) -> None:
    """`ctx.load_cert_chain` from memory (the stdlib only takes paths)."""
    with _memory_file(pair.cert_pem.rstrip(b"\n") + b"\n" + pair.key_pem) as path:
        ctx.load_cert_chain(path)


def load_cadata(ctx: ssl.SSLContext, pem: bytes, *, source: str) -> None:
    """Trust the CAs in `pem`; raise PEMError naming `source` when none parse."""
    parse_certificates(pem, source=source)
    try:
        ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
    except ssl.SSLError as err:
        raise PEMError(f"{source}: {err}") from err
