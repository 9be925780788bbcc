"""How extension API servers are reached (`serve` and `check` share these flags): the front-proxy
client certificate, the address resolution choices and the deny list."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass
from typing import Protocol

from aggregator.sources.options import SourceConfig
from aggregator.util.flags import ConfigError, FlagSet, GoBool, Problems, check_pair, check_readable, csv_list

SECTION = "proxy"
# --backend-deny-cidrs when unset. Both modes: link-local, where cloud metadata services live.
DEFAULT_DENY_CIDRS = ("169.254.0.0/16", "fe80::/10")
# Kube mode adds loopback: no real Service or endpoint points there (kube-apiserver's
# ValidateEndpointIP refuses it in EndpointSlices), so a backend on 127.0.0.1 can only be a request
# forgery towards the gateway's own pod. Local mode keeps it: its demo backends listen on loopback.
KUBE_DEFAULT_DENY_CIDRS = (*DEFAULT_DENY_CIDRS, "127.0.0.0/8", "::1/128")


@dataclass
class BackendOptions:
    proxy_client_cert_file: str | None = None
    proxy_client_key_file: str | None = None
    enable_aggregator_routing: bool = False
    allow_external_name_services: bool = False
    # None: the mode's default (`deny_cidrs`)
    backend_deny_cidrs: list[str] | None = None

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, SECTION, prefix)
        flags.add(
            "--proxy-client-cert-file",
            field="proxy_client_cert_file",
            help="client certificate presented to extension API servers (and to kube-apiserver as the "
            "front proxy); must be signed by their requestheader CA. Re-read on change.",
        )
        flags.add(
            "--proxy-client-key-file", field="proxy_client_key_file", help="private key for --proxy-client-cert-file."
        )
        flags.add(
            "--enable-aggregator-routing",
            field="enable_aggregator_routing",
            action=GoBool,
            help="route to a ready EndpointSlice endpoint instead of the Service's cluster IP.",
        )
        flags.add(
            "--allow-external-name-services",
            field="allow_external_name_services",
            action=GoBool,
            help="allow APIServices backed by ExternalName Services (off: they are a server-side request "
            "forgery risk).",
        )
        flags.add(
            "--backend-deny-cidrs",
            field="backend_deny_cidrs",
            type=csv_list,
            default=None,
            help="backend addresses never dialed (default 169.254.0.0/16,fe80::/10: cloud metadata; kube "
            "mode adds 127.0.0.0/8,::1/128); an empty value allows all but the unspecified addresses "
            "(0.0.0.0/8, ::), which are never dialed.",
        )

    def deny_cidrs(self, *, kube_mode: bool) -> list[str]:
        """`--backend-deny-cidrs`, or the mode's default when it is not given."""
        if self.backend_deny_cidrs is not None:
            return self.backend_deny_cidrs
        return list(KUBE_DEFAULT_DENY_CIDRS if kube_mode else DEFAULT_DENY_CIDRS)

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        problems.check(
            check_pair,
            "--proxy-client-cert-file",
            self.proxy_client_cert_file,
            "--proxy-client-key-file",
            self.proxy_client_key_file,
        )
        problems.check(check_readable, "--proxy-client-cert-file", self.proxy_client_cert_file)
        problems.check(check_readable, "--proxy-client-key-file", self.proxy_client_key_file)
        for cidr in self.backend_deny_cidrs or ():  # the defaults are CIDRs
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                problems.add("--backend-deny-cidrs", f"{cidr!r} is not a CIDR")
        return problems.errors

    def apply_to(self, config: BackendTarget) -> None:
        """After the source's: the deny list's default depends on the mode."""
        config.backends = BackendConfig(
            proxy_client_cert_file=self.proxy_client_cert_file,
            proxy_client_key_file=self.proxy_client_key_file,
            enable_aggregator_routing=self.enable_aggregator_routing,
            allow_external_name_services=self.allow_external_name_services,
            deny_cidrs=tuple(self.deny_cidrs(kube_mode=config.source.kube_mode)),
        )


@dataclass(frozen=True)
class BackendConfig:
    """How backends are reached (`build_backends`), the deny list resolved for the mode."""

    proxy_client_cert_file: str | None = None
    proxy_client_key_file: str | None = None
    enable_aggregator_routing: bool = False
    allow_external_name_services: bool = False
    deny_cidrs: tuple[str, ...] = DEFAULT_DENY_CIDRS


class BackendTarget(Protocol):
    @property
    def source(self) -> SourceConfig: ...

    backends: BackendConfig
