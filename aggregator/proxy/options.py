"""`--delegate-auth`: how a caller's identity reaches kube-apiserver when a request is forwarded to
it (kube mode only)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Protocol

from aggregator.backends.options import SECTION
from aggregator.proxy.delegate import FRONT_PROXY, IMPERSONATE
from aggregator.util.flags import ConfigError, FlagSet


@dataclass
class DelegationOptions:
    delegate_auth: str = FRONT_PROXY

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        FlagSet(parser, SECTION, prefix).add(
            "--delegate-auth",
            field="delegate_auth",
            choices=[FRONT_PROXY, IMPERSONATE],
            default=argparse.SUPPRESS,  # front-proxy; absent unless given (a kube-mode-only flag)
            help="how the caller's identity reaches kube-apiserver: front-proxy headers with "
            "--proxy-client-cert-file (default), or impersonation with the gateway's own credentials.",
        )

    def validate(self) -> list[ConfigError]:
        """argparse refuses a value other than the two (`choices`); whether the flag may be given,
        and what front-proxy needs, are checked across groups."""
        return []

    def apply_to(self, config: DelegationTarget) -> None:
        config.delegate_auth = self.delegate_auth


class DelegationTarget(Protocol):
    delegate_auth: str
