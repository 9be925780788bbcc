"""Certificates for verification tests: CAs, intermediates and leaves with any extension, plus the
two shapes cryptography's builder refuses to make (version-1 and SHA-1-signed certificates)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import NameOID

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
DAY = dt.timedelta(days=1)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey

_SHA256_WITH_RSA = bytes.fromhex("300d06092a864886f70d01010b0500")
_SHA1_WITH_RSA = bytes.fromhex("300d06092a864886f70d0101050500")


def new_key(kind: str = "p256") -> PrivateKey:
    if kind == "p256":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    return rsa.generate_private_key(65537, int(kind.removeprefix("rsa")))


@dataclass(frozen=True)
class Cert:
    cert: x509.Certificate
    key: PrivateKey

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def key_usage(*, cert_sign: bool, digital_signature: bool = True) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass
class Spec:
    """What to put in a certificate; the defaults make a Kubernetes-style client certificate."""

    common_name: str
    organizations: Sequence[str] = ()
    ca: bool = False
    basic_constraints: bool | None = True  # True: critical, False: non-critical, None: absent
    path_length: int | None = None
    key_usage: x509.KeyUsage | None = None
    extended_key_usage: Sequence[x509.ObjectIdentifier] | None = None
    extended_key_usage_critical: bool = False
    authority_key_id: bool = True
    subject_alt_names: Sequence[x509.GeneralName] = ()
    name_constraints: x509.NameConstraints | None = None
    extra: Sequence[tuple[x509.ExtensionType, bool]] = field(default_factory=list)
    not_before: dt.datetime = NOW - DAY
    not_after: dt.datetime = NOW + 30 * DAY
    key: str = "p256"


def _name(common_name: str, organizations: Sequence[str]) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name(attributes)


def _hash_for(key: PrivateKey) -> hashes.SHA256 | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def issue(spec: Spec, issuer: Cert | None = None) -> Cert:
    """A certificate for `spec`, signed by `issuer` (self-signed when None)."""
    key = new_key(spec.key)
    signer = issuer.key if issuer is not None else key
    subject = _name(spec.common_name, spec.organizations)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(spec.not_before)
        .not_valid_after(spec.not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if spec.basic_constraints is not None:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=spec.ca, path_length=spec.path_length), critical=spec.basic_constraints
        )
    usage = spec.key_usage if spec.key_usage is not None else key_usage(cert_sign=spec.ca)
    builder = builder.add_extension(usage, critical=True)
    if spec.extended_key_usage:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage(list(spec.extended_key_usage)), critical=spec.extended_key_usage_critical
        )
    if spec.authority_key_id and issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        )
    if spec.subject_alt_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(list(spec.subject_alt_names)), critical=False
        )
    if spec.name_constraints is not None:
        builder = builder.add_extension(spec.name_constraints, critical=True)
    for extension, critical in spec.extra:
        builder = builder.add_extension(extension, critical=critical)
    return Cert(builder.sign(signer, _hash_for(signer)), key)


# Just enough DER to rewrite a signed certificate.


def _length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _length(len(body)) + body


def _split(der: bytes) -> tuple[int, bytes, bytes]:
    """(tag, body, rest) of the first TLV in `der`."""
    tag, first = der[0], der[1]
    if first < 0x80:
        start, size = 2, first
    else:
        count = first & 0x7F
        start, size = 2 + count, int.from_bytes(der[2 : 2 + count], "big")
    return tag, der[start : start + size], der[start + size :]


def _sign(tbs: bytes, algorithm: bytes, key: PrivateKey, digest: hashes.HashAlgorithm) -> x509.Certificate:
    if isinstance(key, rsa.RSAPrivateKey):
        signature = key.sign(tbs, padding.PKCS1v15(), digest)
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        signature = key.sign(tbs, ec.ECDSA(digest))
    else:
        raise TypeError(f"cannot re-sign with {type(key).__name__}")
    return x509.load_der_x509_certificate(_tlv(0x30, tbs + algorithm + _tlv(0x03, b"\x00" + signature)))


def _parts(cert: x509.Certificate) -> tuple[bytes, bytes]:
    """The TBS and signature-algorithm TLVs of a certificate."""
    _, body, _ = _split(cert.public_bytes(serialization.Encoding.DER))
    _, _, rest = _split(body)
    tbs = body[: len(body) - len(rest)]
    _, _, after_algorithm = _split(rest)
    return tbs, rest[: len(rest) - len(after_algorithm)]


def version1(common_name: str, issuer: Cert | None = None, *, organizations: Sequence[str] = ()) -> Cert:
    """What `openssl x509 -req` makes without an extension file: no version field, no extensions."""
    key = new_key()
    signer = issuer.key if issuer is not None else key
    subject = _name(common_name, organizations)
    template = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + 30 * DAY)
        .sign(signer, hashes.SHA256())
    )
    tbs, algorithm = _parts(template)
    _, body, _ = _split(tbs)
    explicit_v3 = bytes.fromhex("a003020102")
    assert body.startswith(explicit_v3)
    cert = _sign(_tlv(0x30, body[len(explicit_v3) :]), algorithm, signer, hashes.SHA256())
    assert cert.version == x509.Version.v1
    return Cert(cert, key)


def resigned_with_sha1(leaf: Cert, issuer: Cert) -> Cert:
    """`leaf` signed again by its RSA issuer with SHA-1, which Go and cryptography both refuse."""
    tbs, algorithm = _parts(leaf.cert)
    assert algorithm == _SHA256_WITH_RSA and tbs.count(_SHA256_WITH_RSA) == 1
    return Cert(
        _sign(tbs.replace(_SHA256_WITH_RSA, _SHA1_WITH_RSA), _SHA1_WITH_RSA, issuer.key, hashes.SHA1()),
        leaf.key,
    )


def write_chain(directory: Path, stem: str, leaf: Cert, *chain: Cert) -> str:
    """`<stem>.crt` holding the leaf then `chain`, and `<stem>.key`; returns the stem."""
    (directory / f"{stem}.crt").write_bytes(leaf.pem + b"".join(c.pem for c in chain))
    key = leaf.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / f"{stem}.key").write_bytes(key)
    return stem
