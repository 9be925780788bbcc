"""Client-certificate verification answers as Go's crypto/x509 does for kube-apiserver's authenticator:
same acceptances (intermediates, v1 certificates, no EKU, anyEKU, missing SAN/AKI/keyUsage) and the
same refusal texts."""

from __future__ import annotations

import datetime as dt
import ipaddress
import random

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import ClientVerifier, Store, VerificationError

from aggregator.tls import gox509, verify
from aggregator.tls.chainpolicy import ClientChainPolicy
from aggregator.tls.verify import CAPool, CertificateError, ClientCertificate, Rejection
from tests.support.certbuilder import DAY, NOW, Cert, Spec, issue, key_usage, resigned_with_sha1, version1

ANY_EKU = x509.ObjectIdentifier("2.5.29.37.0")
UNKNOWN_AUTHORITY = "x509: certificate signed by unknown authority"
INCOMPATIBLE = "x509: certificate specifies an incompatible key usage"
NOT_FOR_THIS_NAME = "x509: a root or intermediate certificate is not authorized to sign for this name: "
CANNOT_SIGN = "x509: invalid signature: parent certificate cannot sign this kind of certificate"


def go_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def expired(now: dt.datetime, relation: str, bound: dt.datetime) -> str:
    return (
        "x509: certificate has expired or is not yet valid: "
        f"current time {go_time(now)} is {relation} {go_time(bound)}"
    )


def hint(reason: str, candidate: str) -> str:
    return (
        f'{UNKNOWN_AUTHORITY} (possibly because of "{reason}" while trying to verify candidate '
        f'authority certificate "{candidate}")'
    )


@pytest.fixture(scope="module")
def root() -> Cert:
    return issue(Spec("client-ca", ca=True, not_after=NOW + 3650 * DAY))


@pytest.fixture(scope="module")
def intermediate(root: Cert) -> Cert:
    return issue(Spec("team-ca", ca=True), root)


def accepted(result: ClientCertificate | Rejection) -> ClientCertificate:
    assert isinstance(result, ClientCertificate), result
    return result


def refused(result: ClientCertificate | Rejection) -> str:
    assert isinstance(result, Rejection), result
    return result.message


def pool(*anchors: Cert) -> CAPool:
    return CAPool(b"".join(a.pem for a in anchors), source="client-ca.crt")


# Chains


def test_certificate_signed_directly_by_the_ca_names_user_and_groups(root: Cert) -> None:
    leaf = issue(Spec("alice", ("devs", "ops")), root)
    cert = accepted(pool(root).check(leaf.der))
    assert (cert.common_name, cert.organizations) == ("alice", ("devs", "ops"))


def test_chain_through_an_intermediate_verifies_with_the_intermediate_sent(
    root: Cert, intermediate: Cert
) -> None:
    leaf = issue(Spec("bob", ("devs",)), intermediate)
    assert accepted(pool(root).check(leaf.der, intermediates=[intermediate.der])).common_name == "bob"


def test_chain_through_an_intermediate_not_sent_is_an_unknown_authority(
    root: Cert, intermediate: Cert
) -> None:
    leaf = issue(Spec("bob"), intermediate)
    assert refused(pool(root).check(leaf.der)) == UNKNOWN_AUTHORITY


def test_two_intermediates_in_any_order(root: Cert, intermediate: Cert) -> None:
    second = issue(Spec("squad-ca", ca=True), intermediate)
    leaf = issue(Spec("carol"), second)
    ca = pool(root)
    assert accepted(ca.check(leaf.der, intermediates=[intermediate.der, second.der])).common_name == "carol"
    assert accepted(ca.check(leaf.der, intermediates=[second.der, intermediate.der])).common_name == "carol"


def test_intermediates_cannot_stand_in_for_the_ca_file(root: Cert) -> None:
    stranger = issue(Spec("stranger-ca", ca=True))
    leaf = issue(Spec("mallory"), stranger)
    assert refused(pool(root).check(leaf.der, intermediates=[stranger.der])) == UNKNOWN_AUTHORITY


def test_several_anchors_in_one_file(root: Cert) -> None:
    other = issue(Spec("other-ca", ca=True))
    rotated = issue(Spec("client-ca", ca=True))  # same name as `root`, new key
    ca = pool(other, root, rotated)
    for anchor in (root, other, rotated):
        assert accepted(ca.check(issue(Spec("dave"), anchor).der)).common_name == "dave"


def test_forged_signature_names_the_candidate_authority(root: Cert) -> None:
    impostor = issue(Spec("client-ca", ca=True))  # same subject, other key
    leaf = issue(Spec("eve", authority_key_id=False), impostor)
    assert refused(pool(root).check(leaf.der)) == hint("x509: ECDSA verification failure", "client-ca")


def test_validity_windows_of_every_chain_member(root: Cert, intermediate: Cert) -> None:
    old = issue(Spec("team-ca", ca=True, not_before=NOW - 30 * DAY, not_after=NOW - DAY), root)
    leaf = issue(Spec("frank"), old)
    assert refused(pool(root).check(leaf.der, intermediates=[old.der], now=NOW.timestamp())) == expired(
        NOW, "after", NOW - DAY
    )
    future = issue(Spec("grace", not_before=NOW + DAY), intermediate)
    assert refused(
        pool(root).check(future.der, intermediates=[intermediate.der], now=NOW.timestamp())
    ) == expired(NOW, "before", NOW + DAY)


def test_expiry_is_rechecked_against_the_current_time_on_cached_results(root: Cert) -> None:
    leaf = issue(Spec("heidi", not_after=NOW + DAY), root)
    ca = pool(root)
    assert accepted(ca.check(leaf.der, now=NOW.timestamp()))
    later = NOW + 2 * DAY
    assert refused(ca.check(leaf.der, now=later.timestamp())) == expired(later, "after", NOW + DAY)
    much_later = NOW + 3 * DAY  # the cached refusal still names the time of each request
    assert refused(ca.check(leaf.der, now=much_later.timestamp())) == expired(much_later, "after", NOW + DAY)


def test_path_length_constraint(root: Cert) -> None:
    capped = issue(Spec("capped-ca", ca=True, path_length=0, not_after=NOW + 3650 * DAY))
    middle = issue(Spec("middle-ca", ca=True), capped)
    leaf = issue(Spec("ivan"), middle)
    assert refused(pool(capped).check(leaf.der, intermediates=[middle.der])) == (
        "x509: too many intermediates for path length constraint"
    )


# Extended key usage: Go's KeyUsages = [ClientAuth], nested down the chain


def test_server_only_certificate_is_an_incompatible_key_usage(root: Cert) -> None:
    leaf = issue(Spec("web", extended_key_usage=[ExtendedKeyUsageOID.SERVER_AUTH]), root)
    assert refused(pool(root).check(leaf.der)) == INCOMPATIBLE


def test_server_only_intermediate_cannot_issue_client_certificates(root: Cert) -> None:
    web_ca = issue(Spec("web-ca", ca=True, extended_key_usage=[ExtendedKeyUsageOID.SERVER_AUTH]), root)
    leaf = issue(Spec("judy", extended_key_usage=[ExtendedKeyUsageOID.CLIENT_AUTH]), web_ca)
    assert refused(pool(root).check(leaf.der, intermediates=[web_ca.der])) == INCOMPATIBLE


@pytest.mark.parametrize(
    "usages",
    [None, [ExtendedKeyUsageOID.CLIENT_AUTH], [ANY_EKU], [ExtendedKeyUsageOID.SERVER_AUTH, ANY_EKU]],
    ids=["none", "clientAuth", "any", "serverAuth+any"],
)
def test_usages_go_accepts(
    root: Cert, intermediate: Cert, usages: list[x509.ObjectIdentifier] | None
) -> None:
    leaf = issue(Spec("kim", extended_key_usage=usages, extended_key_usage_critical=True), intermediate)
    assert accepted(pool(root).check(leaf.der, intermediates=[intermediate.der]))


# Name constraints: on the CAs, applied to the subject-alternative names below them


def constrained(root: Cert, constraints: x509.NameConstraints) -> Cert:
    return issue(Spec("scoped-ca", ca=True, name_constraints=constraints), root)


def test_dns_name_outside_the_permitted_subtree(root: Cert) -> None:
    scoped = constrained(root, x509.NameConstraints([x509.DNSName("example.com")], None))
    leaf = issue(Spec("svc", subject_alt_names=[x509.DNSName("evil.org")]), scoped)
    assert refused(pool(root).check(leaf.der, intermediates=[scoped.der])) == (
        NOT_FOR_THIS_NAME + 'DNS name "evil.org" is not permitted by any constraint'
    )
    inside = issue(Spec("svc", subject_alt_names=[x509.DNSName("api.example.com")]), scoped)
    assert accepted(pool(root).check(inside.der, intermediates=[scoped.der]))


def test_ip_address_in_an_excluded_subtree(root: Cert) -> None:
    scoped = constrained(
        root, x509.NameConstraints(None, [x509.IPAddress(ipaddress.ip_network("10.0.0.0/8"))])
    )
    leaf = issue(Spec("node", subject_alt_names=[x509.IPAddress(ipaddress.ip_address("10.1.2.3"))]), scoped)
    assert refused(pool(root).check(leaf.der, intermediates=[scoped.der])) == (
        NOT_FOR_THIS_NAME + 'IP address "10.1.2.3" is excluded by constraint "10.0.0.0/8"'
    )


def test_name_constraints_do_not_apply_to_a_leaf_without_alternative_names(root: Cert) -> None:
    """Go checks SANs only; a Kubernetes user certificate (CN and O) has none."""
    scoped = constrained(root, x509.NameConstraints([x509.DNSName("example.com")], None))
    assert accepted(pool(root).check(issue(Spec("leo"), scoped).der, intermediates=[scoped.der]))


# Critical extensions


UNKNOWN_EXTENSION = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), b"\x05\x00")


def test_unknown_critical_extension_is_refused_on_the_leaf_and_on_an_intermediate(root: Cert) -> None:
    leaf = issue(Spec("mia", extra=[(UNKNOWN_EXTENSION, True)]), root)
    assert refused(pool(root).check(leaf.der)) == "x509: unhandled critical extension"
    odd_ca = issue(Spec("odd-ca", ca=True, extra=[(UNKNOWN_EXTENSION, True)]), root)
    leaf = issue(Spec("mia"), odd_ca)
    assert (
        refused(pool(root).check(leaf.der, intermediates=[odd_ca.der]))
        == "x509: unhandled critical extension"
    )


def test_unknown_non_critical_and_known_critical_extensions_are_fine(root: Cert) -> None:
    policies = x509.CertificatePolicies([x509.PolicyInformation(x509.ObjectIdentifier("1.2.3.4"), None)])
    leaf = issue(Spec("nick", extra=[(UNKNOWN_EXTENSION, False), (policies, True)]), root)
    assert accepted(pool(root).check(leaf.der))


def test_what_go_cannot_read_is_refused_even_where_cryptography_would_accept(root: Cert) -> None:
    """A critical SAN holding only names Go does not parse is an "unhandled critical extension" in
    Go; cryptography's profile lets it through, the Go replay does not."""
    other = x509.OtherName(x509.ObjectIdentifier("1.2.3.4"), b"\x05\x00")
    leaf = issue(Spec("una", extra=[(x509.SubjectAlternativeName([other]), True)]), root)
    assert refused(pool(root).check(leaf.der)) == "x509: unhandled critical extension"


def test_what_go_cannot_parse_is_named_as_its_handshake_error(root: Cert) -> None:
    access = x509.AuthorityInformationAccess(
        [
            x509.AccessDescription(
                x509.oid.AuthorityInformationAccessOID.OCSP, x509.UniformResourceIdentifier("http://o")
            )
        ]
    )
    leaf = issue(Spec("val", extra=[(access, True)]), root)
    assert refused(pool(root).check(leaf.der)) == (
        "tls: failed to parse client certificate #0: x509: authority info access incorrectly marked critical"
    )


# What the WebPKI profile refuses and Go accepts


def test_profile_relaxations_go_accepts(root: Cert) -> None:
    ca_without_key_usage = issue(
        Spec("plain-ca", ca=True, basic_constraints=False, key_usage=None, authority_key_id=False), root
    )
    leaves = [
        issue(Spec("no-aki", authority_key_id=False), root),
        issue(Spec("ca-leaf", ca=True), root),  # Go does not look at a leaf's basicConstraints
        issue(Spec("no-bc", basic_constraints=None), root),
        issue(Spec("signer", key_usage=None), root),
    ]
    ca = pool(root)
    for leaf in leaves:
        assert accepted(ca.check(leaf.der))
    leaf = issue(Spec("olga"), ca_without_key_usage)
    assert accepted(ca.check(leaf.der, intermediates=[ca_without_key_usage.der]))


def test_ca_whose_key_usage_forbids_certificate_signing(root: Cert) -> None:
    signer = issue(Spec("sign-only-ca", ca=True, key_usage=key_usage(cert_sign=False)), root)
    leaf = issue(Spec("pat"), signer)
    assert refused(pool(root).check(leaf.der, intermediates=[signer.der])) == hint(
        CANNOT_SIGN, "sign-only-ca"
    )


def test_non_ca_certificate_cannot_issue(root: Cert) -> None:
    not_a_ca = issue(Spec("workload"), root)
    leaf = issue(Spec("quinn"), not_a_ca)
    assert refused(pool(root).check(leaf.der, intermediates=[not_a_ca.der])) == hint(CANNOT_SIGN, "workload")


def test_sha1_signature_is_refused_as_go_refuses_it() -> None:
    rsa_ca = issue(Spec("rsa-ca", ca=True, key="rsa2048"))
    leaf = resigned_with_sha1(issue(Spec("ray"), rsa_ca), rsa_ca)
    assert refused(pool(rsa_ca).check(leaf.der)) == hint(
        "x509: cannot verify signature: insecure algorithm SHA1-RSA", "rsa-ca"
    )


@pytest.mark.parametrize("key", ["ed25519", "rsa1024"])
def test_keys_cryptography_refuses_but_go_accepts_are_named_as_unsupported(key: str) -> None:
    """A documented difference: Go accepts Ed25519 and 1024-bit RSA CAs, cryptography does not."""
    odd = issue(Spec("odd-ca", ca=True, key=key))
    result = refused(pool(odd).check(issue(Spec("sam"), odd).der))
    assert result.startswith("x509: certificate not supported by this verifier: ")


# Version-1 certificates: the fallback


def test_version1_leaf_from_a_version1_ca() -> None:
    ca = version1("legacy-ca")
    leaf = version1("tom", ca, organizations=("ops",))
    cert = accepted(pool(ca).check(leaf.der))
    assert (cert.common_name, cert.organizations) == ("tom", ("ops",))


def test_version1_leaf_from_a_version3_ca_and_version3_leaf_from_a_version1_ca(root: Cert) -> None:
    assert accepted(pool(root).check(version1("uma", root).der))
    legacy = version1("legacy-ca")
    assert accepted(pool(legacy).check(issue(Spec("vic"), legacy).der))


def test_version1_fallback_keeps_go_checks(root: Cert) -> None:
    legacy = version1("legacy-ca")
    server_only = issue(Spec("web", extended_key_usage=[ExtendedKeyUsageOID.SERVER_AUTH]), legacy)
    assert refused(pool(legacy).check(server_only.der)) == INCOMPATIBLE
    stranger = version1("legacy-ca")  # same name, other key
    assert refused(pool(legacy).check(version1("walt", stranger).der)) == hint(
        "x509: ECDSA verification failure", "legacy-ca"
    )
    expired_leaf = issue(Spec("xena", not_after=NOW - DAY, not_before=NOW - 2 * DAY), legacy)
    assert refused(pool(legacy).check(expired_leaf.der, now=NOW.timestamp())) == expired(
        NOW, "after", NOW - DAY
    )


def test_version1_intermediate_is_not_a_ca(root: Cert) -> None:
    legacy_middle = version1("legacy-middle", root)
    leaf = issue(Spec("yan"), legacy_middle)
    assert refused(pool(root).check(leaf.der, intermediates=[legacy_middle.der])) == (
        "x509: certificate is not authorized to sign other certificates"
    )


# The API around the verdicts


def test_identical_chains_are_verified_once(root: Cert, intermediate: Cert) -> None:
    class CountingPolicy(ClientChainPolicy):
        calls = 0

        def verifier(self, store: Store, when: dt.datetime) -> ClientVerifier:
            CountingPolicy.calls += 1
            return super().verifier(store, when)

    ca = CAPool(root.pem, source="client-ca.crt", policy=CountingPolicy())
    leaf = issue(Spec("zoe"), intermediate)
    assert refused(ca.check(leaf.der)) == UNKNOWN_AUTHORITY
    assert refused(ca.check(leaf.der)) == UNKNOWN_AUTHORITY
    assert CountingPolicy.calls == 1
    first = accepted(ca.check(leaf.der, intermediates=[intermediate.der]))
    assert ca.check(leaf.der, intermediates=[intermediate.der]) is first  # the key covers the intermediates
    assert CountingPolicy.calls == 2


def test_the_verdicts_kept_are_bounded_and_the_least_recently_used_goes_first(
    root: Cert, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients choose the chains they present: the cache holds a bounded number of verdicts, and
    the chain every request of a busy client presents stays while one-off chains come and go."""

    class CountingPolicy(ClientChainPolicy):
        calls = 0

        def verifier(self, store: Store, when: dt.datetime) -> ClientVerifier:
            CountingPolicy.calls += 1
            return super().verifier(store, when)

    monkeypatch.setattr(verify, "_CACHED_CHAINS", 3)
    ca = CAPool(root.pem, source="client-ca.crt", policy=CountingPolicy())
    leaf = issue(Spec("zoe"), root)
    accepted(ca.check(leaf.der, key=b"busy"))
    for n in range(10):  # one-off chains, the busy client's between each
        accepted(ca.check(leaf.der, key=b"once %d" % n))
        accepted(ca.check(leaf.der, key=b"busy"))
    assert CountingPolicy.calls == 11  # the busy chain verified once
    accepted(ca.check(leaf.der, key=b"once 0"))  # long evicted: verified again
    assert CountingPolicy.calls == 12
    accepted(ca.check(leaf.der, key=b"once 9"))  # among the three kept
    assert CountingPolicy.calls == 12


def test_refusal_carries_go_certificate_identifier(root: Cert) -> None:
    leaf = issue(Spec("ann"), issue(Spec("elsewhere", ca=True)))
    rejection = pool(root).check(leaf.der)
    assert isinstance(rejection, Rejection)
    assert rejection.certificate.startswith(f"SN={leaf.cert.serial_number}, SKID=")
    ski = leaf.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert f"SKID={ski.hex(':').upper()}, AKID=" in rejection.certificate


def test_malformed_input_is_a_refusal_not_an_exception(root: Cert) -> None:
    assert refused(pool(root).check(b"not a certificate")).startswith("x509: malformed certificate")
    leaf = issue(Spec("bo"), root)
    assert refused(pool(root).check(leaf.der, intermediates=[b"junk"])).startswith(
        "tls: failed to parse client certificate #1: "
    )


def test_an_unexpected_failure_is_a_refusal_not_an_exception(root: Cert) -> None:
    class BrokenPolicy(ClientChainPolicy):
        def verifier(self, store: Store, when: dt.datetime) -> ClientVerifier:
            raise RuntimeError("library surprise")

    ca = CAPool(root.pem, source="client-ca.crt", policy=BrokenPolicy())
    assert refused(ca.check(issue(Spec("eli"), root).der)) == "x509: library surprise"


def test_verify_raises_a_fresh_error_each_time(root: Cert) -> None:
    leaf = issue(Spec("cy"), issue(Spec("elsewhere", ca=True)))
    ca = pool(root)
    errors = []
    for _ in range(2):
        with pytest.raises(CertificateError) as caught:
            ca.verify(leaf.der)
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert str(errors[0]) == UNKNOWN_AUTHORITY
    assert ca.verify(issue(Spec("di"), root).der).common_name == "di"


# Cross-check: cryptography's decision and the Go replay agree


def random_spec(rng: random.Random, name: str, *, ca: bool) -> Spec:
    return Spec(
        name,
        ca=ca,
        basic_constraints=rng.choice([True] * 6 + [False, None]),
        path_length=rng.choice([None, None, None, 0, 1]) if ca else None,
        key_usage=rng.choice([None] * 3 + [key_usage(cert_sign=True)] * 3 + [key_usage(cert_sign=False)]),
        extended_key_usage=rng.choice(
            [None] * 4
            + [
                [ExtendedKeyUsageOID.CLIENT_AUTH],
                [ExtendedKeyUsageOID.SERVER_AUTH],
                [ANY_EKU],
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
            ]
        ),
        extended_key_usage_critical=rng.random() < 0.5,
        authority_key_id=rng.random() < 0.5,
        subject_alt_names=rng.choice([(), (), [x509.DNSName("a.example.com")], [x509.DNSName("evil.org")]]),
        name_constraints=rng.choice([None, None, x509.NameConstraints([x509.DNSName("example.com")], None)])
        if ca
        else None,
        extra=rng.choice([[]] * 12 + [[(UNKNOWN_EXTENSION, True)], [(UNKNOWN_EXTENSION, False)]]),
        not_after=rng.choice([NOW + 30 * DAY] * 15 + [NOW - DAY]),
        not_before=NOW - 2 * DAY,
    )


def test_cryptography_and_the_go_replay_agree_on_generated_chains() -> None:
    """The relaxed WebPKI profile accepts exactly what the Go replay accepts on generated chains: a
    disagreement would mean a policy relaxation is missing or too wide."""
    rng = random.Random(20240501)
    policy = ClientChainPolicy()
    outcomes = set()
    for _ in range(200):
        root = issue(random_spec(rng, "root", ca=True))
        chain = [root]
        for depth in range(rng.choice([0, 1, 1, 2])):
            chain.append(issue(random_spec(rng, f"ca-{depth}", ca=rng.random() < 0.9), chain[-1]))
        leaf = issue(random_spec(rng, "user", ca=rng.random() < 0.2), chain[-1])
        sent = [c.cert for c in chain[1:]]
        rng.shuffle(sent)
        try:
            policy.verifier(Store([root.cert]), NOW).verify(leaf.cert, sent)
            cryptography_accepts = True
        except VerificationError:
            cryptography_accepts = False
        go = gox509.explain(leaf.cert, sent, {root.cert.subject.public_bytes(): [root.cert]}, NOW.timestamp())
        assert cryptography_accepts == (go is None), go
        outcomes.add("accepted" if go is None else "expired" if isinstance(go, gox509.Expired) else go[:40])
    assert len(outcomes) >= 6, outcomes  # the generator reaches acceptances and most refusal kinds
