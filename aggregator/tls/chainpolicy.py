"""cryptography's X.509 path validation, relaxed to accept the client certificates Go accepts.

`build_client_verifier()` applies the CA/Browser Forum (WebPKI) profile. Kubernetes client
certificates are not WebPKI certificates, and kube-apiserver verifies them with Go's crypto/x509
(`Certificate.Verify`, KeyUsages = [ClientAuth]), which checks far less about extensions. Each
relaxation below mirrors a Go rule (crypto/x509 verify.go `isValid`, `checkChainForKeyUsage`;
x509.go `CheckSignatureFrom`; parser.go `processExtensions` for the extensions Go understands):

- leaf: subjectAltName, authorityKeyIdentifier, keyUsage, basicConstraints (even cA=TRUE) and
  nameConstraints may be present or absent, critical or not; Go ignores them on a leaf;
- extendedKeyUsage, leaf and CA alike: absent, anyExtendedKeyUsage or clientAuth, any criticality
  (Go's EKUs nest down the chain, so a serverAuth-only intermediate is refused, as WebPKI does);
- CA: basicConstraints need not be critical (cryptography still requires cA=TRUE, like Go's
  `CheckSignatureFrom`); keyUsage may be absent, and if present must allow keyCertSign;
  authorityKeyIdentifier is free;
- certificate policies, policy constraints, inhibitAnyPolicy and CRL distribution points may be
  critical (Go understands them, so they are not "unhandled critical extensions").

What cryptography still refuses and Go accepts (version-1 certificates, Ed25519 and P-224 keys,
RSA keys under 2048 bits, URI name constraints, critical policy mappings) is listed in
aggregator/tls/verify.py; only the version-1 case has a fallback.
"""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.x509.verification import (
    ClientVerifier,
    Criticality,
    ExtensionPolicy,
    Policy,
    PolicyBuilder,
    Store,
)

from aggregator.tls.gox509 import INCOMPATIBLE_USAGE, allows_client_auth, may_sign_certificates

_ANY = Criticality.AGNOSTIC


def _extended_key_usage(
    _policy: Policy, _cert: x509.Certificate, usages: x509.ExtendedKeyUsage | None
) -> None:
    if not allows_client_auth(usages):
        raise ValueError(INCOMPATIBLE_USAGE)


def _ca_key_usage(_policy: Policy, _cert: x509.Certificate, usage: x509.KeyUsage | None) -> None:
    if not may_sign_certificates(usage):
        raise ValueError("keyUsage does not allow keyCertSign")


def _allowed(policy: ExtensionPolicy, *kinds: type[x509.ExtensionType]) -> ExtensionPolicy:
    """Each of these extensions may be present, critical or not, and is not checked further."""
    for kind in kinds:
        policy = policy.may_be_present(kind, _ANY, None)
    return policy


def _go_understood(policy: ExtensionPolicy) -> ExtensionPolicy:
    return _allowed(
        policy, x509.CertificatePolicies, x509.PolicyConstraints, x509.InhibitAnyPolicy, x509.CRLDistributionPoints
    )


def leaf_policy() -> ExtensionPolicy:
    allowed = _allowed(
        ExtensionPolicy.webpki_defaults_ee(),
        x509.SubjectAlternativeName,
        x509.AuthorityKeyIdentifier,
        x509.KeyUsage,
        x509.BasicConstraints,
        x509.NameConstraints,
    )
    return _go_understood(allowed.may_be_present(x509.ExtendedKeyUsage, _ANY, _extended_key_usage))


def ca_policy() -> ExtensionPolicy:
    return _go_understood(
        ExtensionPolicy.webpki_defaults_ca()
        .require_present(x509.BasicConstraints, _ANY, None)
        .may_be_present(x509.KeyUsage, _ANY, _ca_key_usage)
        .may_be_present(x509.AuthorityKeyIdentifier, _ANY, None)
        .may_be_present(x509.ExtendedKeyUsage, _ANY, _extended_key_usage)
    )


class ClientChainPolicy:
    """Builds a verifier per verification time; the extension policies are made once."""

    def __init__(self) -> None:
        self._ca = ca_policy()
        self._leaf = leaf_policy()

    def verifier(self, store: Store, when: dt.datetime) -> ClientVerifier:
        return (
            PolicyBuilder()
            .store(store)
            .time(when)
            .extension_policies(ca_policy=self._ca, ee_policy=self._leaf)
            .build_client_verifier()
        )
