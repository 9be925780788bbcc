"""`--bind-address`, `--secure-port` and the serving certificate and TLS flags: k8s.io/apiserver's
`SecureServingOptions`, with kube-apiserver's names, defaults and refusals."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field
from typing import Protocol

from aggregator.tls.policy import DEFAULT_MIN_VERSION, VERSIONS, PolicyError, TLSPolicy
from aggregator.util.flags import ConfigError, FlagSet, GoBool, Problems, check_pair, check_readable, csv_list

DEFAULT_CERT_DIR = "apiserver.local.config/certificates"
SECTION = "secure serving"


@dataclass
class SecureServingOptions:
    bind_address: str = "0.0.0.0"
    port: int = 8443
    cert_file: str | None = None
    key_file: str | None = None
    cert_dir: str = DEFAULT_CERT_DIR
    min_tls_version: str = DEFAULT_MIN_VERSION
    cipher_suites: list[str] = field(default_factory=list)
    # HTTP/2 (web/http2/): k8s.io/apiserver's DisableHTTP2Serving and HTTP2MaxStreamsPerConnection
    # (0: kube-apiserver's 100).
    disable_http2_serving: bool = False
    http2_max_streams_per_connection: int = 0

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        d = cls()
        flags = FlagSet(parser, SECTION, prefix)
        flags.add(
            "--bind-address",
            field="bind_address",
            default=d.bind_address,
            help=f"IP address to listen on (default {d.bind_address}).",
        )
        flags.add(
            "--secure-port",
            field="port",
            type=int,
            default=d.port,
            help=f"HTTPS port to serve on (default {d.port}; 0 picks a free port).",
        )
        flags.add(
            "--tls-cert-file",
            field="cert_file",
            help="PEM serving certificate (followed by any intermediates). Re-read when the file changes.",
        )
        flags.add("--tls-private-key-file", field="key_file", help="PEM private key matching --tls-cert-file.")
        flags.add(
            "--cert-dir",
            field="cert_dir",
            default=d.cert_dir,
            help="where a self-signed serving pair (apiserver.crt, apiserver.key) is generated when "
            f"--tls-cert-file is not given (default {d.cert_dir}).",
        )
        flags.add(
            "--tls-min-version",
            field="min_tls_version",
            default=d.min_tls_version,
            help=f"minimum TLS version served: {', '.join(VERSIONS)} (default {d.min_tls_version}).",
        )
        flags.add(
            "--tls-cipher-suites",
            field="cipher_suites",
            type=csv_list,
            default=[],
            help="comma-separated TLS 1.0-1.2 cipher suites, by Go's names (e.g. "
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256); insecure ones are logged, ones this OpenSSL cannot "
            "serve are reported and left out. TLS 1.3 suites are not configurable. Default: the library's.",
        )

        flags.add(
            "--disable-http2-serving",
            field="disable_http2_serving",
            action=GoBool,
            default=False,
            help="serve HTTP/1.1 only: offer no h2 in TLS ALPN (default false: clients that offer h2, as "
            "kubectl and client-go do, get HTTP/2).",
        )
        flags.add(
            "--http2-max-streams-per-connection",
            field="http2_max_streams_per_connection",
            type=int,
            default=d.http2_max_streams_per_connection,
            help="the limit the gateway gives clients for concurrent streams on one HTTP/2 connection "
            "(default 0: kube-apiserver's 100).",
        )

    def tls_policy(self) -> TLSPolicy:
        """The serving TLS policy the flags ask for; ConfigError for a value kube-apiserver would refuse."""
        try:
            return TLSPolicy.from_flags(self.min_tls_version, self.cipher_suites)
        except PolicyError as err:
            raise ConfigError(err.flag, err.problem) from err

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        if not 0 <= self.port <= 65535:
            problems.add("--secure-port", f"{self.port} is not a valid port (0-65535)")
        try:
            ipaddress.ip_address(self.bind_address)
        except ValueError:
            problems.add("--bind-address", f"{self.bind_address!r} is not an IP address")
        problems.check(self.tls_policy)
        problems.check(check_pair, "--tls-cert-file", self.cert_file, "--tls-private-key-file", self.key_file)
        problems.check(check_readable, "--tls-cert-file", self.cert_file)
        problems.check(check_readable, "--tls-private-key-file", self.key_file)
        return problems.errors

    def apply_to(self, config: ServingTarget) -> None:
        config.serving = ServingConfig(
            bind_address=self.bind_address,
            port=self.port,
            cert_file=self.cert_file,
            key_file=self.key_file,
            cert_dir=self.cert_dir,
            tls_policy=self.tls_policy(),
            http2=not self.disable_http2_serving,
            http2_max_streams_per_connection=self.http2_max_streams_per_connection,
        )


@dataclass(frozen=True)
class ServingConfig:
    """The listener and its TLS (`SecureServingOptions.apply_to`), the TLS policy parsed."""

    bind_address: str = "0.0.0.0"
    port: int = 8443
    cert_file: str | None = None
    key_file: str | None = None
    cert_dir: str = DEFAULT_CERT_DIR
    tls_policy: TLSPolicy = field(default_factory=TLSPolicy)
    http2: bool = True
    http2_max_streams_per_connection: int = 0


class ServingTarget(Protocol):
    serving: ServingConfig
