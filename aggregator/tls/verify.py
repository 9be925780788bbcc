"""Verify client certificates the way Go's crypto/x509 does for Kubernetes authenticators.

k8s.io/apiserver's x509 authenticator (pkg/authentication/request/x509/x509.go) calls
`PeerCertificates[0].Verify` with Roots = the CA file, Intermediates = the certificates the client
sent after its own, and KeyUsages = [ClientAuth]. Here a chain must pass cryptography's path
validation (aggregator/tls/chainpolicy.py relaxes its WebPKI profile to Go's rules) and a replay of
Go's checks (aggregator/tls/gox509.py), which also words every refusal as Go words it. The replay
only ever narrows what cryptography accepts; it runs once per new chain, never per request.

Version-1 certificates (what `openssl x509 -req` makes without an extension file) are the one
fallback: cryptography refuses every v1 certificate, Go accepts a v1 root, and a v1 leaf. A leaf
and a CA-file certificate one of which is v1 are accepted when the CA signed the leaf directly and
Go's checks for that two-certificate chain pass; a chain through intermediates with a v1 member
is refused (Go would accept a v3 leaf -> v3 intermediate -> v1 root).

Still refused although Go accepts: Ed25519 and P-224 keys, RSA keys under 2048 bits (Go takes 1024),
RSA-PSS with non-standard parameters, URI name constraints matched by a URI SAN, critical policy
mappings, a leaf whose only chain needs a v1 certificate above an intermediate, and chains longer
than 8 intermediates. Their log line says "x509: certificate not supported by this verifier".

Results are cached per presented chain (leaf and intermediates) for as long as no certificate
involved crosses a validity boundary, so a keep-alive client costs one hash and one lookup.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtensionOID, NameOID
from cryptography.x509.verification import Store, VerificationError

from aggregator.tls import gox509
from aggregator.tls.chainpolicy import ClientChainPolicy
from aggregator.tls.pem import PEMError, parse_certificates
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

UNSUPPORTED = "x509: certificate not supported by this verifier: "
# Verdicts kept per CA file: one per distinct chain presented (clients choose them: bounded).
_CACHED_CHAINS = 4096


class CertificateError(Exception):
    """A client certificate that does not verify; the message reads like Go's x509 errors."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a certificate does not verify, as a value: cached and returned, never raised.

    Caching an exception instance and raising it again chains every raise's frames onto its
    `__traceback__`, so a cached refusal re-raised on each request grew without bound (~5 KB per
    request for every client-certificate caller once a front-proxy CA was configured).
    `certificate` is Go's `certificateIdentifier` of the leaf (x509.go), for the authenticator's
    "verifying certificate %s failed: %w" wrapping.
    """

    message: str
    certificate: str = ""


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """What authenticators need from a verified certificate."""

    common_name: str
    organizations: tuple[str, ...]
    sha256: str  # hex of the DER, for `authentication.kubernetes.io/credential-id`
    not_before: float  # the verified chain's common validity window
    not_after: float


@dataclass(frozen=True, slots=True)
class _Verdict:
    """A verification result and the time span over which it holds."""

    outcome: ClientCertificate | Rejection | gox509.Expired
    since: float
    until: float
    certificate: str = ""


def _names(cert: x509.Certificate) -> tuple[str, tuple[str, ...]]:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return (str(cns[0].value) if cns else "", tuple(str(o.value) for o in orgs))


def _colon_hex(data: bytes | None) -> str:
    return ":".join(f"{b:02X}" for b in data or b"")


def certificate_identifier(cert: x509.Certificate) -> str:
    """x509.go `certificateIdentifier`: serial, subject and authority key identifiers."""
    ski = gox509.key_identifier(cert, ExtensionOID.SUBJECT_KEY_IDENTIFIER)
    aki = gox509.key_identifier(cert, ExtensionOID.AUTHORITY_KEY_IDENTIFIER)
    return f"SN={cert.serial_number}, SKID={_colon_hex(ski)}, AKID={_colon_hex(aki)}"


def chain_key(der: bytes, intermediates: Sequence[bytes]) -> bytes:
    """A fixed-size cache key: clients choose what they send, so its size must not be theirs."""
    digest = hashlib.sha256(der)
    for cert in intermediates:
        digest.update(len(cert).to_bytes(4, "big"))
        digest.update(cert)
    return digest.digest()


def _window(chain: Sequence[x509.Certificate]) -> tuple[float, float]:
    return (
        max(c.not_valid_before_utc.timestamp() for c in chain),
        min(c.not_valid_after_utc.timestamp() for c in chain),
    )


def _stable_span(certs: Sequence[x509.Certificate], ts: float) -> tuple[float, float]:
    """The span around `ts` in which none of `certs` becomes valid or expires."""
    bounds = [
        t for c in certs for t in (c.not_valid_before_utc.timestamp(), c.not_valid_after_utc.timestamp())
    ]
    return (
        max((b for b in bounds if b <= ts), default=-math.inf),
        min((b for b in bounds if b > ts), default=math.inf),
    )


class CAPool:
    """Trust anchors from one PEM bundle."""

    def __init__(self, pem: bytes, *, source: str, policy: ClientChainPolicy | None = None) -> None:
        self.source = source
        self.pem = pem
        self.anchors = parse_certificates(pem, source=source)
        self._by_subject: dict[bytes, list[x509.Certificate]] = {}
        for anchor in self.anchors:
            self._by_subject.setdefault(anchor.subject.public_bytes(), []).append(anchor)
        self._store = Store(self.anchors)
        self._policy = policy or ClientChainPolicy()
        # The verdicts of recent chains, least recently used first: an OrderedDict rather than
        # cachetools' LRUCache, whose get is four Python calls on every request with a certificate.
        self._cache: collections.OrderedDict[bytes, _Verdict] = collections.OrderedDict()

    def check(
        self,
        der: bytes,
        *,
        intermediates: Sequence[bytes] = (),
        now: float | None = None,
        key: bytes | None = None,
    ) -> ClientCertificate | Rejection:
        """The verified identity, or the reason it does not verify. Raises nothing: the request
        path asks this for every certificate that is not the front proxy's.

        `intermediates` are the DER certificates the client sent after `der` (Go's
        `PeerCertificates[1:]`); they are untrusted and only help build a chain to the CA file.
        `key` is `chain_key(der, intermediates)` when the caller kept it (one per connection).
        """
        ts = time.time() if now is None else now
        if key is None:
            key = chain_key(der, intermediates)
        cache = self._cache
        verdict = cache.get(key)
        if verdict is not None:
            cache.move_to_end(key)
        if verdict is None or not verdict.since <= ts < verdict.until:
            try:
                verdict = self._verify(der, intermediates, ts)
            except Exception as err:  # a certificate nothing here can read is refused, never a 500
                log.warning("client certificate not verifiable", extra=fields(reason=repr(err)))
                verdict = _Verdict(Rejection(f"x509: {err}"), -math.inf, math.inf)
            cache[key] = verdict
            if len(cache) > _CACHED_CHAINS:
                cache.popitem(last=False)
        outcome = verdict.outcome
        if isinstance(outcome, gox509.Expired):
            return Rejection(outcome.render(ts), verdict.certificate)
        return outcome

    def verify(
        self, der: bytes, *, intermediates: Sequence[bytes] = (), now: dt.datetime | None = None
    ) -> ClientCertificate:
        """`check`, raising a new CertificateError for a refusal (for callers off the hot path)."""
        result = self.check(der, intermediates=intermediates, now=None if now is None else now.timestamp())
        if isinstance(result, Rejection):
            raise CertificateError(result.message)
        return result

    def _verify(self, der: bytes, intermediates: Sequence[bytes], ts: float) -> _Verdict:
        try:
            leaf = x509.load_der_x509_certificate(der)
        except ValueError as err:
            return _Verdict(Rejection(f"x509: malformed certificate: {err}"), -math.inf, math.inf)
        identifier = certificate_identifier(leaf)
        untrusted: list[x509.Certificate] = []
        for index, raw in enumerate(intermediates, start=1):
            try:
                untrusted.append(x509.load_der_x509_certificate(raw))
            except ValueError as err:  # crypto/tls refuses the handshake with this text
                message = f"tls: failed to parse client certificate #{index}: x509: malformed certificate: "
                return _Verdict(Rejection(message + str(err), identifier), -math.inf, math.inf)
        when = dt.datetime.fromtimestamp(ts, dt.UTC)
        chain: list[x509.Certificate] | None
        refused: gox509.GoError | None
        try:
            chain = self._policy.verifier(self._store, when).verify(leaf, untrusted).chain
            # Go's rules must agree: they are stricter in corners an extension policy cannot
            # express (an unparsable critical SAN, a critical key identifier, ...).
            refused = gox509.explain(leaf, untrusted, self._by_subject, ts)
        except VerificationError as err:
            chain = self._version1_chain(leaf, ts)
            refused = None
            if not chain:
                refused = gox509.explain(leaf, untrusted, self._by_subject, ts) or UNSUPPORTED + str(err)
        if chain and refused is None:
            since, until = _window(chain)
            common_name, organizations = _names(leaf)
            certificate = ClientCertificate(
                common_name, organizations, hashlib.sha256(der).hexdigest(), since, until
            )
            return _Verdict(certificate, since, until, identifier)
        assert refused is not None
        outcome = refused if isinstance(refused, gox509.Expired) else Rejection(refused, identifier)
        since, until = _stable_span([leaf, *untrusted, *self.anchors], ts)
        return _Verdict(outcome, since, until, identifier)

    def _version1_chain(self, leaf: x509.Certificate, ts: float) -> list[x509.Certificate] | None:
        """The fallback for version-1 certificates, which cryptography refuses outright: Go's whole
        `Verify` for a leaf signed directly by a CA-file certificate, one of the two being v1."""
        for anchor in self._by_subject.get(leaf.issuer.public_bytes(), []):
            if x509.Version.v1 not in (leaf.version, anchor.version):
                continue
            chain = [leaf, anchor]
            if (
                gox509.is_valid(leaf, gox509.LEAF, (), ts) is None
                and gox509.check_signature_from(leaf, anchor) is None
                and gox509.is_valid(anchor, gox509.ROOT, [leaf], ts) is None
                and gox509.chain_allows_client_auth(chain)
            ):
                return chain
        return None


class CAFile:
    """A CA bundle file, re-read when it changes (kube-apiserver reloads its CA files the same way).

    A broken new version is logged and the previous pool stays in use.
    """

    def __init__(self, path: str, *, on_change: Callable[[CAPool], None] | None = None, interval: float = 1.0):
        self.path = path
        self._watcher = PollingWatcher(  # before the read: see PollingWatcher's baseline
            lambda: stat_fingerprint([path]), self.reload, interval=interval, name=f"ca-file {path}"
        )
        self.pool = CAPool(Path(path).read_bytes(), source=path)  # raises PEMError at start-up
        self._on_change = on_change

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
