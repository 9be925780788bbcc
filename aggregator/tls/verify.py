"""Verify client certificates the way Go's crypto/x509 does for Kubernetes authenticators.

Every certificate in a CA file is a trust anchor (Go's roots pool): a client certificate is valid
when one of them directly signed it, both are inside their validity windows, and the client
certificate's extended key usage (if any) allows client authentication. Version-1 certificates,
which `openssl x509 -req` produces and kube-apiserver accepts, are accepted too (cryptography's
WebPKI verifier refuses them, hence this module). Results are cached per certificate, so a
keep-alive client costs one dictionary lookup per request.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aggregator.tls.pem import PEMError, parse_certificates
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

_ANY_EKU = x509.ObjectIdentifier("2.5.29.37.0")


class CertificateError(Exception):
    """A client certificate that does not verify; the message reads like Go's x509 errors."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a certificate does not verify, as a value: cached and returned, never raised.

    Caching an exception instance and raising it again chains every raise's frames onto its
    `__traceback__`, so a cached refusal re-raised on each request grew without bound (~5 KB per
    request for every client-certificate caller once a front-proxy CA was configured).
    """

    message: str


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """What authenticators need from a verified certificate."""

    common_name: str
    organizations: tuple[str, ...]
    sha256: str  # hex of the DER, for `authentication.kubernetes.io/credential-id`
    not_before: float
    not_after: float


def _go_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _names(cert: x509.Certificate) -> tuple[str, tuple[str, ...]]:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return (str(cns[0].value) if cns else "", tuple(str(o.value) for o in orgs))


def _client_usage_rejection(cert: x509.Certificate) -> Rejection | None:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages and _ANY_EKU not in usages:
        return Rejection("x509: certificate specifies an incompatible key usage")
    return None


def _may_sign(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return cert.version == x509.Version.v1


class CAPool:
    """Trust anchors from one PEM bundle."""

    def __init__(self, pem: bytes, *, source: str) -> None:
        self.source = source
        self.pem = pem
        self.anchors = parse_certificates(pem, source=source)
        self._by_subject: dict[bytes, list[x509.Certificate]] = {}
        for anchor in self.anchors:
            self._by_subject.setdefault(anchor.subject.public_bytes(), []).append(anchor)
        self._cache: LRUCache[bytes, ClientCertificate | Rejection] = LRUCache(maxsize=4096)

    def check(self, der: bytes, *, now: float | None = None) -> ClientCertificate | Rejection:
        """The verified identity, or the reason it does not verify. Raises nothing: the request
        path asks this for every certificate that is not the front proxy's."""
        cached = self._cache.get(der)
        if cached is None:
            cached = self._verify_uncached(der)
            self._cache[der] = cached
        if isinstance(cached, Rejection):
            return cached
        ts = time.time() if now is None else now
        if cached.not_before <= ts <= cached.not_after:
            return cached
        bound = cached.not_after if ts > cached.not_after else cached.not_before
        relation = "after" if ts > cached.not_after else "before"
        moment = dt.datetime.fromtimestamp(ts, dt.UTC)
        return Rejection(
            "x509: certificate has expired or is not yet valid: current time "
            f"{_go_time(moment)} is {relation} {_go_time(dt.datetime.fromtimestamp(bound, dt.UTC))}"
        )

    def verify(self, der: bytes, *, now: dt.datetime | None = None) -> ClientCertificate:
        """`check`, raising a new CertificateError for a refusal (for callers off the hot path)."""
        result = self.check(der, now=None if now is None else now.timestamp())
        if isinstance(result, Rejection):
            raise CertificateError(result.message)
        return result

    def _verify_uncached(self, der: bytes) -> ClientCertificate | Rejection:
        try:
            leaf = x509.load_der_x509_certificate(der)
        except ValueError as err:
            return Rejection(f"x509: malformed certificate: {err}")
        usage = _client_usage_rejection(leaf)
        if usage is not None:
            return usage
        issuer = self._find_issuer(leaf)
        if issuer is None:
            return Rejection("x509: certificate signed by unknown authority")
        # The chain is valid only while both the leaf and its anchor are.
        not_before = max(leaf.not_valid_before_utc, issuer.not_valid_before_utc)
        not_after = min(leaf.not_valid_after_utc, issuer.not_valid_after_utc)
        common_name, organizations = _names(leaf)
        return ClientCertificate(
            common_name,
            organizations,
            hashlib.sha256(der).hexdigest(),
            not_before.timestamp(),
            not_after.timestamp(),
        )

    def _find_issuer(self, leaf: x509.Certificate) -> x509.Certificate | None:
        for candidate in self._by_subject.get(leaf.issuer.public_bytes(), []):
            if not _may_sign(candidate):
                continue
            try:
                leaf.verify_directly_issued_by(candidate)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return candidate
        return None


class CAFile:
    """A CA bundle file, re-read when it changes (kube-apiserver reloads its CA files the same way).

    A broken new version is logged and the previous pool stays in use.
    """

    def __init__(self, path: str, *, on_change: Callable[[CAPool], None] | None = None, interval: float = 1.0):
        self.path = path
        self.pool = CAPool(Path(path).read_bytes(), source=path)  # raises PEMError at start-up
        self._on_change = on_change
        self._watcher = PollingWatcher(
            lambda: stat_fingerprint([path]), self.reload, interval=interval, name=f"ca-file {path}"
        )

    def reload(self) -> None:
        try:
            pem = Path(self.path).read_bytes()
            if pem == self.pool.pem:
                return
            pool = CAPool(pem, source=self.path)
        except (OSError, PEMError) as err:
            log.warning("CA file not reloaded, keeping the previous one", extra=fields(file=self.path, reason=str(err)))
            return
        self.pool = pool
        log.info("CA file reloaded", extra=fields(file=self.path, certificates=len(pool.anchors)))
        if self._on_change is not None:
            self._on_change(pool)

    def start(self) -> None:
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()
