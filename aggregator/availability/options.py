"""`--write-apiservice-status`: whether Available conditions are written to kube-apiserver."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Protocol

from aggregator.util.flags import ConfigError, FlagSet, GoBool


@dataclass
class AvailabilityOptions:
    write_apiservice_status: bool = False

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        FlagSet(parser, "availability", prefix).add(
            "--write-apiservice-status",
            field="write_apiservice_status",
            action=GoBool,
            default=argparse.SUPPRESS,  # false; absent unless given (a kube-mode-only flag)
            help="kube mode: write each APIService's Available condition to its status (off by default: "
            "kube-apiserver's own aggregator writes it too). Only when the status or reason differs from "
            "the stored one, and with --leader-elect only from the replica holding the lease.",
        )

    def validate(self) -> list[ConfigError]:
        """Nothing this group can get wrong on its own (whether it may be given is checked across
        groups: a kube-mode-only flag)."""
        return []

    def apply_to(self, config: AvailabilityTarget) -> None:
        config.write_apiservice_status = self.write_apiservice_status


class AvailabilityTarget(Protocol):
    write_apiservice_status: bool
