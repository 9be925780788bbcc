"""`--workers`: how many processes serve the port."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Protocol

from aggregator.tls.options import SECTION
from aggregator.util.flags import ConfigError, FlagSet
from aggregator.workers.cpus import usable_cpus


@dataclass
class WorkersOptions:
    # None: the CPUs this process may use (`cpus.usable_cpus`)
    count: int | None = None

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        FlagSet(parser, SECTION, prefix).add(
            "--workers",
            field="count",
            type=int,
            default=None,
            help="processes serving the port (SO_REUSEPORT), fed by one control process that alone "
            "watches, probes and fetches; 1 is a single process with no supervisor (default: the CPUs "
            "this process may use, from its CPU affinity and cgroup CPU quota).",
        )

    def validate(self) -> list[ConfigError]:
        if self.count is not None and self.count < 1:
            return [ConfigError("--workers", f"{self.count} is not a valid worker count (1 or more)")]
        return []

    def processes(self) -> int:
        """The worker count to run: `--workers`, or the usable CPUs."""
        return self.count if self.count is not None else usable_cpus()

    def apply_to(self, config: WorkersTarget) -> None:
        """The CPUs are counted here, once: the control and every worker see the same count."""
        config.workers = self.processes()


class WorkersTarget(Protocol):
    workers: int
