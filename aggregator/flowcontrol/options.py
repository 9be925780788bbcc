"""`--enable-priority-and-fairness`: k8s.io/apiserver's `FeatureOptions` flag, its default and its refusal.

On (the default, as in kube-apiserver) the request path has API Priority and Fairness in place of
max-in-flight, with `--max-requests-inflight + --max-mutating-requests-inflight` as the server's
concurrency limit; off, max-in-flight limits each kind on its own (`web/inflight.py`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aggregator.util.flags import ConfigError, FlagSet, go_bool


@dataclass
class FlowControlOptions:
    enable_priority_and_fairness: bool = True

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "limits and timeouts", prefix)
        flags.add(
            "--enable-priority-and-fairness",
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

    def validate(self, *, max_requests_inflight: int, max_mutating_requests_inflight: int) -> list[ConfigError]:
        """`FeatureOptions.ApplyTo`'s refusal, in its words."""
        errors: list[ConfigError] = []
        if self.enable_priority_and_fairness and max_requests_inflight + max_mutating_requests_inflight <= 0:
            errors.append(
                ConfigError(
                    "--enable-priority-and-fairness",
                    f"invalid configuration: MaxRequestsInFlight={max_requests_inflight} and "
                    f"MaxMutatingRequestsInFlight={max_mutating_requests_inflight}; they must add up to "
                    "something positive",
                )
            )
        return errors

    @staticmethod
    def server_concurrency_limit(max_requests_inflight: int, max_mutating_requests_inflight: int) -> int:
        """The limit the priority levels share (`FeatureOptions.ApplyTo`)."""
        return max_requests_inflight + max_mutating_requests_inflight
