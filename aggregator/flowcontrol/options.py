"""`--enable-priority-and-fairness`: k8s.io/apiserver's `FeatureOptions` flag, its default and its refusal.

On (the default, as in kube-apiserver) the request path has API Priority and Fairness in place of
max-in-flight, with `--max-requests-inflight + --max-mutating-requests-inflight` as the server's
concurrency limit (`FlowControlConfig`, what `assembly.build_flowcontrol` builds the gate from);
off, max-in-flight limits each kind on its own (`web/inflight.py`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Protocol

from aggregator.util.flags import ConfigError, FlagSet, go_bool
from aggregator.web.options import RequestLimits, ServerRunOptions

FLAG = "--enable-priority-and-fairness"


@dataclass(frozen=True)
class FlowControlConfig:
    """What API Priority and Fairness is built from: the seats the priority levels share, and the
    request timeout whose quarter bounds a watch's wait in a queue."""

    server_concurrency_limit: int
    request_timeout: float


class FlowControlTarget(Protocol):
    requests: RequestLimits
    flowcontrol: FlowControlConfig | None


@dataclass
class FlowControlOptions:
    enable_priority_and_fairness: bool = True

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "limits and timeouts", prefix)
        flags.add(
            FLAG,
            field="enable_priority_and_fairness",
            type=go_bool,
            nargs="?",
            const=True,
            default=True,
            help="if true, replace the max-in-flight handler with API Priority and Fairness: requests are "
            "classified by FlowSchemas into priority levels that share --max-requests-inflight plus "
            "--max-mutating-requests-inflight seats, queue fairly per flow, and get 429 only past their "
            "level's queues (default true).",
        )

    def validate(self) -> list[ConfigError]:
        """The flag alone is a boolean its parser already checked; what it requires of the limits
        spans groups (`concurrency_problems`)."""
        return []

    def apply_to(self, config: FlowControlTarget) -> None:
        """`FeatureOptions.ApplyTo`: the server's concurrency limit from the limits applied before."""
        if not self.enable_priority_and_fairness:
            config.flowcontrol = None
            return
        requests = config.requests
        config.flowcontrol = FlowControlConfig(
            server_concurrency_limit=requests.max_requests_inflight + requests.max_mutating_requests_inflight,
            request_timeout=requests.request_timeout,
        )


def concurrency_problems(options: FlowControlOptions, server: ServerRunOptions) -> list[ConfigError]:
    """`FeatureOptions.ApplyTo`'s refusal, in its words: with APF the limits must leave some seats."""
    read_only, mutating = server.max_requests_inflight, server.max_mutating_requests_inflight
    if options.enable_priority_and_fairness and read_only + mutating <= 0:
        return [
            ConfigError(
                FLAG,
                f"invalid configuration: MaxRequestsInFlight={read_only} and "
                f"MaxMutatingRequestsInFlight={mutating}; they must add up to something positive",
            )
        ]
    return []
