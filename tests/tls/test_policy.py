"""`--tls-min-version` and `--tls-cipher-suites`: component-base's names and messages, enforced by OpenSSL."""

from __future__ import annotations

import asyncio
import logging
import ssl

import pytest

from aggregator.tls.policy import (
    SUITES,
    PolicyError,
    TLSPolicy,
    openssl_can_serve,
    parse_cipher_suites,
    parse_min_version,
)
from aggregator.tls.serving import new_server_context
from tests.conftest import StartGateway

# Go 1.23's crypto/tls.CipherSuites() and InsecureCipherSuites(), by name (what component-base accepts).
GO_SECURE = {
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    *(
        f"TLS_ECDHE_{auth}_WITH_{cipher}"
        for auth in ("ECDSA", "RSA")
        for cipher in (
            "AES_128_CBC_SHA",
            "AES_256_CBC_SHA",
            "AES_128_GCM_SHA256",
            "AES_256_GCM_SHA384",
            "CHACHA20_POLY1305_SHA256",
        )
    ),
}
GO_INSECURE = {
    *(
        f"TLS_RSA_WITH_{cipher}"
        for cipher in (
            "RC4_128_SHA",
            "3DES_EDE_CBC_SHA",
            "AES_128_CBC_SHA",
            "AES_256_CBC_SHA",
            "AES_128_CBC_SHA256",
            "AES_128_GCM_SHA256",
            "AES_256_GCM_SHA384",
        )
    ),
    *(
        f"TLS_ECDHE_{auth}_WITH_{c}"
        for auth in ("ECDSA", "RSA")
        for c in ("RC4_128_SHA", "AES_128_CBC_SHA256")
    ),
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
}
ALIASES = {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"}

# The test PKI's serving key is ECDSA P-256.
LISTED, EXCLUDED = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"


# --- parsing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("VersionTLS10", ssl.TLSVersion.TLSv1),
        ("VersionTLS11", ssl.TLSVersion.TLSv1_1),
        ("VersionTLS12", ssl.TLSVersion.TLSv1_2),
        ("VersionTLS13", ssl.TLSVersion.TLSv1_3),
        ("", ssl.TLSVersion.TLSv1_2),  # component-base TLSVersion(""): the default
    ],
)
def test_min_version_names(value: str, expected: ssl.TLSVersion) -> None:
    assert parse_min_version(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("VersionTLS14", 'unknown tls version "VersionTLS14"'),
        ("versiontls12", 'unknown tls version "versiontls12"'),
        ("TLSv1.2", 'unknown tls version "TLSv1.2"'),
        ("1.3", 'unknown tls version "1.3"'),
        ('Ver"sion', 'unknown tls version "Ver\\"sion"'),
    ],
)
def test_unknown_min_version_is_refused_with_upstreams_words(value: str, message: str) -> None:
    """Upstream's words, then the values it lists only in --help."""
    with pytest.raises(PolicyError) as caught:
        parse_min_version(value)
    assert caught.value.flag == "--tls-min-version"
    assert caught.value.problem == (
        f"{message}; possible values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
    )


def test_every_go_name_is_accepted_and_nothing_else() -> None:
    assert set(SUITES) == GO_SECURE | GO_INSECURE | ALIASES
    assert len(SUITES) == 27
    assert {n for n, s in SUITES.items() if s.insecure} == GO_INSECURE
    assert [s.name for s in parse_cipher_suites(sorted(SUITES))] == sorted(SUITES)


@pytest.mark.parametrize(
    ("names", "unknown"),
    [
        (["TLS_FOO"], "TLS_FOO"),
        (["tls_ecdhe_ecdsa_with_aes_128_gcm_sha256"], "tls_ecdhe_ecdsa_with_aes_128_gcm_sha256"),
        (["ECDHE-ECDSA-AES128-GCM-SHA256"], "ECDHE-ECDSA-AES128-GCM-SHA256"),  # OpenSSL's name is not Go's
        ([LISTED, "TLS_BAR", "TLS_BAZ"], "TLS_BAR"),  # the first unknown one, like upstream's loop
    ],
)
def test_unknown_suite_is_refused_with_upstreams_words(names: list[str], unknown: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_cipher_suites(names)
    assert caught.value.flag == "--tls-cipher-suites"
    assert caught.value.problem == f"Cipher suite {unknown} not supported or doesn't exist"


def test_aliases_are_the_sha256_suites() -> None:
    for alias in ALIASES:
        full = SUITES[f"{alias}_SHA256"]
        assert (SUITES[alias].iana_id, SUITES[alias].openssl) == (full.iana_id, full.openssl)


def test_openssl_names_are_the_same_suites_as_gos() -> None:
    """Each OpenSSL name this build serves carries the IANA id of the Go name it stands for."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.set_ciphers("ALL:@SECLEVEL=0")
    ids = {c["name"]: c["id"] & 0xFFFF for c in probe.get_ciphers()}
    checked = 0
    for suite in SUITES.values():
        if suite.openssl is None:
            assert ids[suite.name] == suite.iana_id  # OpenSSL names TLS 1.3 suites like Go does
        elif suite.openssl in ids:
            assert ids[suite.openssl] == suite.iana_id, suite.name
            checked += 1
    assert checked >= 16  # every ECDHE AES/CHACHA suite and the plain-RSA AES ones on OpenSSL 3


# --- policy ---------------------------------------------------------------------------------------------


def test_tls13_names_are_accepted_silently_and_leave_tls12_without_suites() -> None:
    """Go ignores TLS 1.3 ids in Config.CipherSuites: such a list leaves TLS <= 1.2 nothing to agree on."""
    policy = TLSPolicy.from_flags("VersionTLS12", ["TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256"])
    assert policy.openssl_ciphers() == []
    assert policy.unservable == ()
    assert policy.startup_warnings(security_level=2) == []
    assert new_server_context(policy).minimum_version == ssl.TLSVersion.TLSv1_3


def test_listed_suites_become_the_tls12_cipher_list_in_order_without_duplicates() -> None:
    policy = TLSPolicy.from_flags(
        "",
        [EXCLUDED, "TLS_AES_256_GCM_SHA384", LISTED, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", EXCLUDED],
        can_serve=lambda _name: True,
    )
    assert policy.openssl_ciphers() == [
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ]
    ctx = new_server_context(policy)
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"]
    assert tls12 == policy.openssl_ciphers()
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_insecure_suites_are_warned_once_each_with_upstreams_words() -> None:
    policy = TLSPolicy.from_flags(
        "VersionTLS12",
        [
            "TLS_RSA_WITH_AES_128_CBC_SHA",
            LISTED,
            "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
            "TLS_RSA_WITH_AES_128_CBC_SHA",
        ],
        can_serve=lambda _name: True,
    )
    assert policy.startup_warnings(security_level=2) == [
        "Use of insecure cipher 'TLS_RSA_WITH_AES_128_CBC_SHA' detected.",
        "Use of insecure cipher 'TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256' detected.",
    ]


def test_suites_openssl_cannot_serve_are_left_out_and_reported_in_one_line() -> None:
    lacking = {"RC4-SHA", "DES-CBC3-SHA"}
    names = ["TLS_RSA_WITH_RC4_128_SHA", LISTED, "TLS_RSA_WITH_3DES_EDE_CBC_SHA"]
    policy = TLSPolicy.from_flags("VersionTLS12", names, can_serve=lambda name: name not in lacking)
    assert policy.unservable == ("TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA")
    assert policy.openssl_ciphers() == ["ECDHE-ECDSA-AES128-GCM-SHA256"]
    report = [line for line in policy.startup_warnings(security_level=2) if "cannot serve" in line]
    assert report == [
        f"--tls-cipher-suites: {ssl.OPENSSL_VERSION} cannot serve TLS_RSA_WITH_RC4_128_SHA, "
        "TLS_RSA_WITH_3DES_EDE_CBC_SHA; left out"
    ]


def test_when_nothing_servable_is_listed_only_tls13_is_served_never_the_defaults() -> None:
    policy = TLSPolicy.from_flags("VersionTLS12", ["TLS_RSA_WITH_RC4_128_SHA"], can_serve=lambda _name: False)
    assert policy.startup_warnings(security_level=2)[-1].endswith(
        "; left out, so no TLS 1.2 suite is left and only TLS 1.3 clients can connect"
    )
    assert new_server_context(policy).minimum_version == ssl.TLSVersion.TLSv1_3


def test_the_real_probe_matches_what_openssl_lists() -> None:
    assert openssl_can_serve("ECDHE-ECDSA-AES128-GCM-SHA256")
    assert not openssl_can_serve("NOT-A-CIPHER")


@pytest.mark.parametrize("version", ["VersionTLS10", "VersionTLS11"])
def test_old_versions_are_set_and_the_security_level_that_defeats_them_is_reported(version: str) -> None:
    policy = TLSPolicy.from_flags(version, [])
    assert new_server_context(policy).minimum_version == parse_min_version(version)
    lines = policy.startup_warnings(security_level=2)
    if ssl.OPENSSL_VERSION_INFO >= (3,):
        assert lines == [
            f"--tls-min-version: {ssl.OPENSSL_VERSION} at security level 2 refuses the SHA-1 signatures "
            "TLS 1.0 and 1.1 handshakes need, so clients below TLS 1.2 will fail"
        ]
    assert policy.startup_warnings(security_level=0) == []


def test_the_default_policy_is_tls12_and_the_librarys_suites() -> None:
    default = new_server_context()
    plain = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert default.minimum_version == ssl.TLSVersion.TLSv1_2
    assert default.get_ciphers() == plain.get_ciphers()
    assert TLSPolicy.from_flags("VersionTLS12", []).startup_warnings(security_level=2) == []


# --- end to end -----------------------------------------------------------------------------------------


def client(
    *, max_version: ssl.TLSVersion | None = None, min_version: ssl.TLSVersion | None = None
) -> ssl.SSLContext:
    ctx = ssl._create_unverified_context()
    if max_version is not None:
        ctx.maximum_version = max_version
    if min_version is not None:
        ctx.minimum_version = min_version
    return ctx


def tls12_offering(openssl_name: str) -> ssl.SSLContext:
    ctx = client(max_version=ssl.TLSVersion.TLSv1_2)
    ctx.set_ciphers(openssl_name)
    return ctx


async def handshake(port: int, ctx: ssl.SSLContext) -> tuple[str, str]:
    """(protocol, cipher) the gateway agreed to; raises when it refused."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    sslobj = writer.get_extra_info("ssl_object")
    agreed = (sslobj.version(), sslobj.cipher()[0])
    writer.close()
    await writer.wait_closed()
    return agreed


REFUSED = (ssl.SSLError, ConnectionResetError)


async def test_min_version_tls13_refuses_a_tls12_client_and_serves_a_tls13_one(
    start_gateway: StartGateway,
) -> None:
    server = await start_gateway(tls_min_version="VersionTLS13")
    with pytest.raises(REFUSED):
        await handshake(server.port, client(max_version=ssl.TLSVersion.TLSv1_2))
    protocol, _ = await handshake(server.port, client(min_version=ssl.TLSVersion.TLSv1_3))
    assert protocol == "TLSv1.3"


async def test_default_min_version_still_serves_tls12(start_gateway: StartGateway) -> None:
    server = await start_gateway()
    assert (await handshake(server.port, client(max_version=ssl.TLSVersion.TLSv1_2)))[0] == "TLSv1.2"


async def test_cipher_list_refuses_an_excluded_suite_and_serves_a_listed_one(
    start_gateway: StartGateway,
) -> None:
    server = await start_gateway(tls_cipher_suites=[LISTED])
    with pytest.raises(REFUSED):
        await handshake(server.port, tls12_offering(SUITES[EXCLUDED].openssl or ""))
    assert await handshake(server.port, tls12_offering(SUITES[LISTED].openssl or "")) == (
        "TLSv1.2",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    )
    # TLS 1.3 is not governed by the list, as in Go.
    assert (await handshake(server.port, client(min_version=ssl.TLSVersion.TLSv1_3)))[0] == "TLSv1.3"


async def test_a_tls13_only_list_serves_tls13_clients_only(start_gateway: StartGateway) -> None:
    server = await start_gateway(tls_cipher_suites=["TLS_AES_128_GCM_SHA256"])
    with pytest.raises(REFUSED):
        await handshake(server.port, client(max_version=ssl.TLSVersion.TLSv1_2))
    assert (await handshake(server.port, client(min_version=ssl.TLSVersion.TLSv1_3)))[0] == "TLSv1.3"


async def test_start_logs_insecure_suites_and_what_openssl_cannot_serve(
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    lacking = [
        n
        for n in ("TLS_RSA_WITH_RC4_128_SHA", "TLS_RSA_WITH_3DES_EDE_CBC_SHA")
        if not openssl_can_serve(SUITES[n].openssl or "")
    ]
    if not lacking:
        pytest.skip("this OpenSSL serves RC4 and 3DES")
    caplog.set_level(logging.WARNING, logger="aggregator.tls.serving")
    server = await start_gateway(tls_cipher_suites=[LISTED, *lacking])
    messages = [r.getMessage() for r in caplog.records if r.name == "aggregator.tls.serving"]
    insecure = [f"Use of insecure cipher '{name}' detected." for name in lacking]
    assert messages == [
        *insecure,
        f"--tls-cipher-suites: {ssl.OPENSSL_VERSION} cannot serve {', '.join(lacking)}; left out",
    ]
    # The rest of the list is still enforced.
    assert (await handshake(server.port, tls12_offering(SUITES[LISTED].openssl or "")))[1] == SUITES[
        LISTED
    ].openssl
