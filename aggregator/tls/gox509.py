"""Go's crypto/x509 verification rules, to word refusals the way kube-apiserver logs them.

cryptography's verifier decides what may be accepted (aggregator/tls/chainpolicy.py); `explain`
replays `Certificate.Verify` (crypto/x509 verify.go) with Roots = the CA file,
Intermediates = what the client sent and KeyUsages = [ClientAuth], as k8s.io/apiserver's x509
authenticator calls it, and returns the error Go would have returned: same checks, same order
(leaf `isValid`, `buildChains` over roots then intermediates with the signature-check budget, then
`checkChainForKeyUsage`), same texts. It returns None when Go would have accepted the certificate.
aggregator/tls/verify.py accepts a chain only when both agree, and the same primitives decide its
version-1 fallback.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from aggregator.model.fielderrors import go_quote
from aggregator.tls.nameconstraints import violation

LEAF, INTERMEDIATE, ROOT = "leaf", "intermediate", "root"

ANY_EXTENDED_KEY_USAGE = x509.ObjectIdentifier("2.5.29.37.0")
UNKNOWN_AUTHORITY = "x509: certificate signed by unknown authority"
INCOMPATIBLE_USAGE = "x509: certificate specifies an incompatible key usage"
UNHANDLED_CRITICAL_EXTENSION = "x509: unhandled critical extension"
NOT_AUTHORIZED_TO_SIGN = "x509: certificate is not authorized to sign other certificates"
TOO_MANY_INTERMEDIATES = "x509: too many intermediates for path length constraint"
CONSTRAINT_VIOLATION = "x509: invalid signature: parent certificate cannot sign this kind of certificate"
SIGNATURE_CHECK_LIMIT = "x509: signature check attempts limit reached while verifying certificate chain"
UNSUPPORTED_ALGORITHM = "x509: cannot verify signature: algorithm unimplemented"
MAX_SIGNATURE_CHECKS = 100  # verify.go maxChainSignatureChecks

# parser.go `processExtensions`: the id-ce extensions Go understands (SAN and name constraints only
# when it could read them, see `_understood`), plus authority information access.
_HANDLED = frozenset(f"2.5.29.{n}" for n in (14, 15, 17, 19, 30, 31, 32, 33, 35, 36, 37, 54)) | {
    "1.3.6.1.5.5.7.1.1"
}
# SignatureAlgorithm.String() of the algorithms Go refuses as insecure (x509.go `checkSignature`).
_INSECURE = {
    "1.2.840.113549.1.1.4": "MD5-RSA",
    "1.2.840.113549.1.1.5": "SHA1-RSA",
    "1.2.840.10045.4.1": "ECDSA-SHA1",
}


@dataclass(frozen=True, slots=True)
class Expired:
    """Go's `Expired` error: its text embeds the current time, so it is rendered at each use."""

    relation: str  # "before" or "after"
    bound: float

    def render(self, now: float) -> str:
        return (
            "x509: certificate has expired or is not yet valid: current time "
            f"{go_time(now)} is {self.relation} {go_time(self.bound)}"
        )


GoError = str | Expired


def go_time(ts: float) -> str:
    """`time.Format(time.RFC3339)` of a UTC instant."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _extension(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> x509.ExtensionType | None:
    try:
        return cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        return None


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints | None:
    value = _extension(cert, ExtensionOID.BASIC_CONSTRAINTS)
    return value if isinstance(value, x509.BasicConstraints) else None


def allows_client_auth(usages: x509.ExtendedKeyUsage | None) -> bool:
    """`checkChainForKeyUsage` for one certificate: no EKU, anyExtendedKeyUsage or clientAuth."""
    if usages is None or len(usages) == 0:
        return True
    return ANY_EXTENDED_KEY_USAGE in usages or ExtendedKeyUsageOID.CLIENT_AUTH in usages


def may_sign_certificates(usage: x509.KeyUsage | None) -> bool:
    """`CheckSignatureFrom`: a key usage that says anything must include keyCertSign."""
    if usage is None or usage.key_cert_sign:
        return True
    says_something = (
        usage.digital_signature
        or usage.content_commitment
        or usage.key_encipherment
        or usage.data_encipherment
        or usage.key_agreement
        or usage.crl_sign
    )
    return not says_something


def _understood(ext: x509.Extension[x509.ExtensionType]) -> bool:
    oid = ext.oid.dotted_string
    if oid not in _HANDLED:
        return False
    known = (x509.DNSName, x509.RFC822Name, x509.IPAddress, x509.UniformResourceIdentifier)
    value = ext.value
    if isinstance(value, x509.SubjectAlternativeName):
        return any(isinstance(name, known) for name in value)  # an empty SAN is "unhandled"
    if isinstance(value, x509.NameConstraints):
        subtrees = [*(value.permitted_subtrees or ()), *(value.excluded_subtrees or ())]
        return all(isinstance(name, known) for name in subtrees)
    return True


def has_unhandled_critical_extension(cert: x509.Certificate) -> bool:
    """`len(c.UnhandledCriticalExtensions) > 0`."""
    return any(ext.critical and not _understood(ext) for ext in cert.extensions)


def parse_error(cert: x509.Certificate) -> str | None:
    """What Go's parser (parser.go `parseCertificate`, `processExtensions`) refuses outright."""
    if cert.serial_number < 0:
        return "x509: negative serial number"
    for ext in cert.extensions:
        if ext.critical and ext.oid == ExtensionOID.SUBJECT_KEY_IDENTIFIER:
            return "x509: subject key identifier incorrectly marked critical"
        if ext.critical and ext.oid == ExtensionOID.AUTHORITY_INFORMATION_ACCESS:
            return "x509: authority info access incorrectly marked critical"
    return None


def validity_error(cert: x509.Certificate, now: float) -> Expired | None:
    if now < cert.not_valid_before_utc.timestamp():
        return Expired("before", cert.not_valid_before_utc.timestamp())
    if now > cert.not_valid_after_utc.timestamp():
        return Expired("after", cert.not_valid_after_utc.timestamp())
    return None


def check_signature_from(child: x509.Certificate, parent: x509.Certificate) -> str | None:
    """`Certificate.CheckSignatureFrom`: may `parent` sign certificates, and did it sign `child`?"""
    constraints = _basic_constraints(parent)
    if (parent.version == x509.Version.v3 and constraints is None) or (
        constraints is not None and not constraints.ca
    ):
        return CONSTRAINT_VIOLATION
    usage = _extension(parent, ExtensionOID.KEY_USAGE)
    if not may_sign_certificates(usage if isinstance(usage, x509.KeyUsage) else None):
        return CONSTRAINT_VIOLATION
    insecure = _INSECURE.get(child.signature_algorithm_oid.dotted_string)
    if insecure is not None:
        return f"x509: cannot verify signature: insecure algorithm {insecure}"
    try:
        child.verify_directly_issued_by(parent)
    except InvalidSignature:
        key = parent.public_key()
        if isinstance(key, rsa.RSAPublicKey):
            return "crypto/rsa: verification error"
        if isinstance(key, ec.EllipticCurvePublicKey):
            return "x509: ECDSA verification failure"
        if isinstance(key, ed25519.Ed25519PublicKey):
            return "x509: Ed25519 verification failure"
        return UNSUPPORTED_ALGORITHM
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return UNSUPPORTED_ALGORITHM
    return None


def is_valid(
    cert: x509.Certificate, kind: str, chain: Sequence[x509.Certificate], now: float
) -> GoError | None:
    """`Certificate.isValid`: may `cert` extend `chain` (leaf first) as a `kind` certificate?"""
    if has_unhandled_critical_extension(cert):
        return UNHANDLED_CRITICAL_EXTENSION
    expired = validity_error(cert, now)
    if expired is not None:
        return expired
    if kind != LEAF:
        constraints = _extension(cert, ExtensionOID.NAME_CONSTRAINTS)
        if isinstance(constraints, x509.NameConstraints):
            for below in chain:
                names = _extension(below, ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
                if isinstance(names, x509.SubjectAlternativeName):
                    refused = violation(list(names), constraints)
                    if refused is not None:
                        return refused
    basic = _basic_constraints(cert)
    if kind == INTERMEDIATE and (basic is None or not basic.ca):
        return NOT_AUTHORIZED_TO_SIGN
    if basic is not None and basic.path_length is not None and len(chain) - 1 > basic.path_length:
        return TOO_MANY_INTERMEDIATES
    return None


def chain_allows_client_auth(chain: Sequence[x509.Certificate]) -> bool:
    """`checkChainForKeyUsage(chain, [ExtKeyUsageClientAuth])`: EKUs nest down the chain."""
    for cert in chain:
        usages = _extension(cert, ExtensionOID.EXTENDED_KEY_USAGE)
        if not allows_client_auth(usages if isinstance(usages, x509.ExtendedKeyUsage) else None):
            return False
    return True


def _display_name(cert: x509.Certificate) -> str:
    for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME):
        values = cert.subject.get_attributes_for_oid(oid)
        if values and values[0].value:
            return str(values[0].value)
    return f"serial:{cert.serial_number}"


def key_identifier(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> bytes | None:
    """The subject or authority key identifier, None when absent or unreadable."""
    try:
        value = _extension(cert, oid)
    except ValueError:
        return None
    if isinstance(value, x509.SubjectKeyIdentifier):
        return value.digest
    if isinstance(value, x509.AuthorityKeyIdentifier):
        return value.key_identifier
    return None


def _already_in_chain(candidate: x509.Certificate, chain: Sequence[x509.Certificate]) -> bool:
    """verify.go `alreadyInChain`: same subject, key and SAN, so cross-signatures cannot loop."""
    names = _extension(candidate, ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    return any(
        cert.subject == candidate.subject
        and cert.public_key() == candidate.public_key()
        and _extension(cert, ExtensionOID.SUBJECT_ALTERNATIVE_NAME) == names
        for cert in chain
    )


class _ChainBuilder:
    """verify.go `buildChains`, keeping Go's error precedence: the last failed candidate's error,
    else "unknown authority" with the first signature failure as its hint."""

    def __init__(
        self,
        roots: Mapping[bytes, Sequence[x509.Certificate]],
        intermediates: Mapping[bytes, Sequence[x509.Certificate]],
        now: float,
    ) -> None:
        self.roots = roots
        self.intermediates = intermediates
        self.now = now
        self.signature_checks = 0

    def _parents(self, child: x509.Certificate) -> list[tuple[str, x509.Certificate]]:
        """`CertPool.findPotentialParents`: same issuer name, likeliest key identifier first."""
        want = key_identifier(child, ExtensionOID.AUTHORITY_KEY_IDENTIFIER)

        def likelihood(candidate: x509.Certificate) -> int:
            have = key_identifier(candidate, ExtensionOID.SUBJECT_KEY_IDENTIFIER)
            if have == want:
                return 0
            return 1 if (have is None) != (want is None) else 2

        issuer = child.issuer.public_bytes()
        roots = sorted(self.roots.get(issuer, ()), key=likelihood)
        intermediates = sorted(self.intermediates.get(issuer, ()), key=likelihood)
        return [(ROOT, c) for c in roots] + [(INTERMEDIATE, c) for c in intermediates]

    def build(self, chain: list[x509.Certificate]) -> tuple[list[list[x509.Certificate]], GoError | None]:
        child = chain[-1]
        chains: list[list[x509.Certificate]] = []
        err: GoError | None = None
        hint: tuple[str, x509.Certificate] | None = None
        for kind, candidate in self._parents(child):
            if _already_in_chain(candidate, chain):
                continue
            self.signature_checks += 1
            if self.signature_checks > MAX_SIGNATURE_CHECKS:
                err = SIGNATURE_CHECK_LIMIT
                continue
            signature = check_signature_from(child, candidate)
            if signature is not None:
                hint = hint or (signature, candidate)
                continue
            invalid = is_valid(candidate, kind, chain, self.now)
            if invalid is not None:
                err = invalid
                continue
            if kind == ROOT:
                chains.append([*chain, candidate])
            else:
                found, err = self.build([*chain, candidate])
                chains.extend(found)
        if chains:
            return chains, None
        if err is None:
            err = UNKNOWN_AUTHORITY
            if hint is not None:
                err += (
                    f" (possibly because of {go_quote(hint[0])} while trying to verify candidate "
                    f"authority certificate {go_quote(_display_name(hint[1]))})"
                )
        return [], err


def explain(
    leaf: x509.Certificate,
    intermediates: Sequence[x509.Certificate],
    roots: Mapping[bytes, Sequence[x509.Certificate]],
    now: float,
) -> GoError | None:
    """The error `leaf.Verify(...)` returns for a client certificate, or None if Go accepts it.

    `roots` maps DER subject names to the CA file's certificates (Go's `CertPool.byName`). A
    certificate Go cannot parse fails the TLS handshake in Go; that error is returned in its words.
    """
    try:
        for index, cert in enumerate((leaf, *intermediates)):
            unparsable = parse_error(cert)
            if unparsable is not None:
                return f"tls: failed to parse client certificate #{index}: {unparsable}"
        invalid = is_valid(leaf, LEAF, (), now)
        if invalid is not None:
            return invalid
        subject = leaf.subject.public_bytes()
        if any(root == leaf for root in roots.get(subject, ())):
            chains = [[leaf]]  # `opts.Roots.contains(c)`
        else:
            pool: dict[bytes, list[x509.Certificate]] = {}
            for cert in dict.fromkeys(intermediates):  # CertPool.AddCert ignores duplicates
                pool.setdefault(cert.subject.public_bytes(), []).append(cert)
            chains, err = _ChainBuilder(roots, pool, now).build([leaf])
            if err is not None:
                return err
        if not any(chain_allows_client_auth(chain) for chain in chains):
            return INCOMPATIBLE_USAGE
        return None
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:  # unparsable: Go's parser refuses it too
        return f"x509: {err}"
