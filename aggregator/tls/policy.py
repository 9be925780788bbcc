"""`--tls-min-version` and `--tls-cipher-suites`: Go's names, checked like kube-apiserver, applied to OpenSSL.

The names and error texts are `k8s.io/component-base/cli/flag/ciphersuites_flag.go`'s (`TLSVersion`,
`TLSCipherSuites`): the suites of Go 1.23's `tls.CipherSuites()` and `tls.InsecureCipherSuites()` plus two
legacy CHACHA20 aliases. The insecure-suite warning is `k8s.io/apiserver/pkg/server/secure_serving.go
tlsConfig`'s.

Go's `tls.Config.CipherSuites` only governs TLS 1.0-1.2 ("TLS 1.3 ciphersuites are not configurable"), yet
component-base accepts the three `TLS_AES_*`/`TLS_CHACHA20_*` names and passes them on, where Go ignores
them. So here: accepted, no warning, and TLS 1.3 keeps OpenSSL's defaults (the same three suites). A list
that leaves no TLS 1.2 suite means Go finds no shared suite for a TLS 1.2 client; OpenSSL refuses an empty
cipher list, so the same outcome is reached by raising the minimum version to TLS 1.3.

A listed suite this OpenSSL build cannot serve (OpenSSL 3 commonly lacks RC4 and 3DES) is left out and
reported at start; nothing falls back to the library defaults.
"""

from __future__ import annotations

import json
import ssl
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

DEFAULT_MIN_VERSION = "VersionTLS12"


@dataclass(frozen=True)
class Suite:
    """One Go cipher-suite name: its IANA id, OpenSSL's name for it, and Go's insecure flag."""

    name: str
    iana_id: int
    # OpenSSL's cipher-list name; None for the TLS 1.3 suites, which neither Go nor this flag selects.
    openssl: str | None
    insecure: bool


def _suites() -> Mapping[str, Suite]:
    secure = [
        ("TLS_AES_128_GCM_SHA256", 0x1301, None),
        ("TLS_AES_256_GCM_SHA384", 0x1302, None),
        ("TLS_CHACHA20_POLY1305_SHA256", 0x1303, None),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", 0xC009, "ECDHE-ECDSA-AES128-SHA"),
        ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", 0xC00A, "ECDHE-ECDSA-AES256-SHA"),
        ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", 0xC013, "ECDHE-RSA-AES128-SHA"),
        ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", 0xC014, "ECDHE-RSA-AES256-SHA"),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 0xC02B, "ECDHE-ECDSA-AES128-GCM-SHA256"),
        ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 0xC02C, "ECDHE-ECDSA-AES256-GCM-SHA384"),
        ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 0xC02F, "ECDHE-RSA-AES128-GCM-SHA256"),
        ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 0xC030, "ECDHE-RSA-AES256-GCM-SHA384"),
        ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", 0xCCA8, "ECDHE-RSA-CHACHA20-POLY1305"),
        ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 0xCCA9, "ECDHE-ECDSA-CHACHA20-POLY1305"),
        # component-base keeps the pre-Go-1.16 names "for backward compatibility".
        ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", 0xCCA8, "ECDHE-RSA-CHACHA20-POLY1305"),
        ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", 0xCCA9, "ECDHE-ECDSA-CHACHA20-POLY1305"),
    ]
    insecure = [
        ("TLS_RSA_WITH_RC4_128_SHA", 0x0005, "RC4-SHA"),
        ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", 0x000A, "DES-CBC3-SHA"),
        ("TLS_RSA_WITH_AES_128_CBC_SHA", 0x002F, "AES128-SHA"),
        ("TLS_RSA_WITH_AES_256_CBC_SHA", 0x0035, "AES256-SHA"),
        ("TLS_RSA_WITH_AES_128_CBC_SHA256", 0x003C, "AES128-SHA256"),
        ("TLS_RSA_WITH_AES_128_GCM_SHA256", 0x009C, "AES128-GCM-SHA256"),
        ("TLS_RSA_WITH_AES_256_GCM_SHA384", 0x009D, "AES256-GCM-SHA384"),
        ("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", 0xC007, "ECDHE-ECDSA-RC4-SHA"),
        ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", 0xC011, "ECDHE-RSA-RC4-SHA"),
        ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", 0xC012, "ECDHE-RSA-DES-CBC3-SHA"),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", 0xC023, "ECDHE-ECDSA-AES128-SHA256"),
        ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", 0xC027, "ECDHE-RSA-AES128-SHA256"),
    ]
    table = {name: Suite(name, iana, openssl, False) for name, iana, openssl in secure}
    table.update({name: Suite(name, iana, openssl, True) for name, iana, openssl in insecure})
    return MappingProxyType(table)


SUITES: Mapping[str, Suite] = _suites()

VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType(
    {
        "VersionTLS10": ssl.TLSVersion.TLSv1,
        "VersionTLS11": ssl.TLSVersion.TLSv1_1,
        "VersionTLS12": ssl.TLSVersion.TLSv1_2,
        "VersionTLS13": ssl.TLSVersion.TLSv1_3,
    }
)


class PolicyError(ValueError):
    """A flag value component-base would reject; `problem` is its error text."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


def parse_min_version(name: str) -> ssl.TLSVersion:
    """component-base `TLSVersion`: empty means the default (TLS 1.2, as `secure_serving.go` starts from)."""
    if not name:
        return VERSIONS[DEFAULT_MIN_VERSION]
    try:
        return VERSIONS[name]
    except KeyError:
        # Go's %q; json quoting agrees for every printable name.
        # Upstream's error names no valid value (its --help does); the list follows its words.
        raise PolicyError(
            "--tls-min-version",
            f"unknown tls version {json.dumps(name, ensure_ascii=False)}; "
            f"possible values: {', '.join(sorted(VERSIONS))}",
        ) from None


def parse_cipher_suites(names: Sequence[str]) -> tuple[Suite, ...]:
    """component-base `TLSCipherSuites`: every name must be one of Go's, the first unknown one is the error."""
    suites = []
    for name in names:
        suite = SUITES.get(name)
        if suite is None:
            raise PolicyError("--tls-cipher-suites", f"Cipher suite {name} not supported or doesn't exist")
        suites.append(suite)
    return tuple(suites)


def openssl_can_serve(openssl_name: str) -> bool:
    """Whether this OpenSSL build, at its default security level, offers the named TLS <= 1.2 suite."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.set_ciphers(openssl_name)
    except ssl.SSLError:
        return False
    return any(cipher["name"] == openssl_name for cipher in probe.get_ciphers())


@dataclass(frozen=True)
class TLSPolicy:
    """What the serving contexts enforce. The default is the gateway's behaviour without the flags."""

    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    # As listed; empty keeps the library's default TLS 1.2 suites.
    suites: tuple[Suite, ...] = ()
    # Listed Go names this OpenSSL cannot serve; left out of the cipher list.
    unservable: tuple[str, ...] = ()

    @classmethod
    def from_flags(
        cls,
        min_version: str,
        cipher_suites: Sequence[str],
        *,
        can_serve: Callable[[str], bool] = openssl_can_serve,
    ) -> TLSPolicy:
        """Parse both flags (PolicyError on a bad value) and find the suites this OpenSSL lacks."""
        version = parse_min_version(min_version)
        suites = parse_cipher_suites(cipher_suites)
        unservable = _unique(s.name for s in suites if s.openssl is not None and not can_serve(s.openssl))
        return cls(version, suites, tuple(unservable))

    def openssl_ciphers(self) -> list[str]:
        """The TLS <= 1.2 cipher list handed to OpenSSL: listed order, aliases folded, unservable left out."""
        missing = set(self.unservable)
        return _unique(s.openssl for s in self.suites if s.openssl is not None and s.name not in missing)

    def apply(self, ctx: ssl.SSLContext) -> None:
        """Set the minimum version and, when suites were listed, the TLS <= 1.2 cipher list on `ctx`."""
        with warnings.catch_warnings():
            # The ssl module deprecates TLS 1.0/1.1; asking for them is the operator's explicit choice.
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = self.min_version
        if not self.suites:
            return
        ciphers = self.openssl_ciphers()
        if ciphers:
            ctx.set_ciphers(":".join(ciphers))
        else:
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3

    def startup_warnings(self, security_level: int) -> list[str]:
        """Lines to log once at start: upstream's insecure-suite warnings, then what OpenSSL cannot do."""
        insecure = _unique(s.name for s in self.suites if s.insecure)
        lines = [f"Use of insecure cipher '{name}' detected." for name in insecure]
        if self.unservable:
            line = f"--tls-cipher-suites: {ssl.OPENSSL_VERSION} cannot serve {', '.join(self.unservable)}; left out"
            if not self.openssl_ciphers():
                line += ", so no TLS 1.2 suite is left and only TLS 1.3 clients can connect"
            lines.append(line)
        if (
            self.min_version < ssl.TLSVersion.TLSv1_2
            and security_level > 0
            and ssl.OPENSSL_VERSION_INFO >= (3,)
        ):
            lines.append(
                f"--tls-min-version: {ssl.OPENSSL_VERSION} at security level {security_level} refuses the SHA-1 "
                "signatures TLS 1.0 and 1.1 handshakes need, so clients below TLS 1.2 will fail"
            )
        return lines


# Without the flags: TLS >= 1.2 and the library's suites (immutable, so safe to share).
DEFAULT_POLICY = TLSPolicy()


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
