"""Keys and certificates, built with cryptography: CAs, serving and client certificates, and the
self-signed serving pair kube-apiserver generates in `--cert-dir` when no pair is given.

What `aggregator certs init` writes, what the demo issues, and what `--cert-dir` generates are all
made here; `commands/certs.py` arranges them into the gateway's PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey

CA_DAYS = 3650
LEAF_DAYS = 365
# Backdate so a peer whose clock is a little behind still accepts a fresh certificate.
BACKDATE = dt.timedelta(hours=1)


@dataclass(frozen=True)
class KeyPair:
    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return key_to_pem(self.key)


def key_to_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _validity(days: int, not_before: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    start = not_before or (dt.datetime.now(dt.UTC) - BACKDATE)
    return start, start + dt.timedelta(days=days)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: PrivateKey,
    days: int,
    not_before: dt.datetime | None,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What a CA and a leaf have alike: names, key, serial, validity, basic constraints, and the
    key usage (digital signature; a CA signs certificates and CRLs, and nothing else does)."""
    start, end = _validity(days, not_before)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def new_ca(common_name: str, *, days: int = CA_DAYS) -> KeyPair:
    """A self-signed CA that may only sign certificates."""
    key = new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key, days, None, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in hosts:
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _issue(
    ca: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    *,
    hosts: Sequence[str] = (),
    days: int = LEAF_DAYS,
    not_before: dt.datetime | None = None,
) -> KeyPair:
    key = new_key()
    builder = (
        _builder(subject, ca.cert.subject, key, days, not_before, ca=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def issue_serving_cert(
    ca: KeyPair,
    hosts: Sequence[str],
    *,
    common_name: str | None = None,
    days: int = LEAF_DAYS,
    not_before: dt.datetime | None = None,
) -> KeyPair:
    """A TLS server certificate valid for every name and IP in `hosts`."""
    return _issue(
        ca,
        _name(common_name or (hosts[0] if hosts else "aggregator")),
        ExtendedKeyUsageOID.SERVER_AUTH,
        hosts=hosts,
        days=days,
        not_before=not_before,
    )


def issue_client_cert(
    ca: KeyPair,
    user: str,
    groups: Sequence[str] = (),
    *,
    days: int = LEAF_DAYS,
    not_before: dt.datetime | None = None,
) -> KeyPair:
    """A client certificate the Kubernetes way: CN is the user, one O per group."""
    return _issue(ca, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH, days=days, not_before=not_before)


def write_cert(path: Path, *certs: x509.Certificate) -> None:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))


def write_key(path: Path, key: PrivateKey) -> None:
    """Private keys are created 0600 and never world-readable, even for an instant."""
    data = key_to_pem(key)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def write_pair(directory: Path, stem: str, pair: KeyPair) -> list[Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    write_cert(cert_path, pair.cert)
    write_key(key_path, pair.key)
    return [cert_path, key_path]


def load_pair(directory: Path, stem: str) -> KeyPair:
    cert = x509.load_pem_x509_certificate((directory / f"{stem}.crt").read_bytes())
    key = serialization.load_pem_private_key((directory / f"{stem}.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / stem}.key is not an EC key")
    return KeyPair(cert, key)


DEFAULT_HOSTS = ("localhost", "127.0.0.1")


def self_signed_serving_pair(cert_dir: Path, hosts: Sequence[str]) -> tuple[Path, Path, bool]:
    """What kube-apiserver does with --cert-dir when no serving cert is given: generate once, reuse after.

    The certificate file holds the leaf followed by its own CA, like upstream's self-signed pair.
    Returns (cert, key, whether they were generated now).
    """
    cert_path, key_path = cert_dir / "apiserver.crt", cert_dir / "apiserver.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path, False
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = new_ca(f"{hosts[0] if hosts else 'localhost'}-ca@{int(dt.datetime.now(dt.UTC).timestamp())}")
    leaf = issue_serving_cert(ca, [*DEFAULT_HOSTS, *hosts])
    write_cert(cert_path, leaf.cert, ca.cert)
    write_key(key_path, leaf.key)
    return cert_path, key_path, True
