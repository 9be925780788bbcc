"""The request limits, timeouts and shutdown flags (k8s.io/apiserver's `ServerRunOptions`, with
kube-apiserver's names, defaults and refusals), and the logging flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Protocol

from aggregator.util.flags import ConfigError, FlagSet, GoDuration, Problems
from aggregator.web.accesslog import AccessLogError, AccessLogPolicy

# kube-apiserver's request limits and timeouts (k8s.io/apiserver pkg/server/config.go NewConfig).
DEFAULT_MAX_REQUESTS_INFLIGHT = 400
DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT = 200
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_MIN_REQUEST_TIMEOUT = 1800


@dataclass
class ServerRunOptions:
    max_requests_inflight: int = DEFAULT_MAX_REQUESTS_INFLIGHT
    max_mutating_requests_inflight: int = DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    # Seconds; an int on the command line, as upstream's flag (tests may use fractions).
    min_request_timeout: float = DEFAULT_MIN_REQUEST_TIMEOUT
    shutdown_delay_duration: float = 0.0
    shutdown_watch_termination_grace_period: float = 0.0

    @classmethod
    def add_shutdown_flags(cls, parser: argparse.ArgumentParser, prefix: str, *, section: str) -> None:
        """The graceful termination flags, under `section` (secure serving, where --help has always
        shown them)."""
        shutdown = FlagSet(parser, section, prefix)
        shutdown.add(
            "--shutdown-delay-duration",
            field="shutdown_delay_duration",
            action=GoDuration,
            default=0.0,
            help="on SIGTERM, fail /readyz and keep serving this long before closing (default 0s).",
        )
        shutdown.add(
            "--shutdown-watch-termination-grace-period",
            field="shutdown_watch_termination_grace_period",
            action=GoDuration,
            default=0.0,
            help="once the listener has closed, the longest watches and exec/attach/port-forward tunnels "
            "are given to end; they are ended at 200 per second or faster, so all within this period "
            "(default 0s: all at once).",
        )

    @classmethod
    def add_limit_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        """kube-apiserver's max-in-flight and timeout flags (`ServerRunOptions.AddUniversalFlags`)."""
        flags = FlagSet(parser, "limits and timeouts", prefix)
        flags.add(
            "--max-requests-inflight",
            field="max_requests_inflight",
            type=int,
            default=DEFAULT_MAX_REQUESTS_INFLIGHT,
            help="the most non-mutating requests (get, list) executing at once; more get 429 with "
            "Retry-After: 1. Watches and other long-running requests, and system:masters, are never "
            f"limited. 0 disables the limit (default {DEFAULT_MAX_REQUESTS_INFLIGHT}).",
        )
        flags.add(
            "--max-mutating-requests-inflight",
            field="max_mutating_requests_inflight",
            type=int,
            default=DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT,
            help="the most mutating requests (create, update, patch, delete...) executing at once; 0 "
            f"disables the limit (default {DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT}).",
        )
        flags.add(
            "--request-timeout",
            field="request_timeout",
            action=GoDuration,
            default=DEFAULT_REQUEST_TIMEOUT,
            help="how long a non-long-running request may take before it is answered 504 (a shorter "
            "?timeout= in the request applies instead); 0 disables it (default 1m0s).",
        )
        flags.add(
            "--min-request-timeout",
            field="min_request_timeout",
            type=int,
            default=DEFAULT_MIN_REQUEST_TIMEOUT,
            help="a watch without timeoutSeconds is ended after a random time between this many seconds "
            "and twice as many, so clients re-watch spread out; 0: never (default "
            f"{DEFAULT_MIN_REQUEST_TIMEOUT}).",
        )

    def validate(self) -> list[ConfigError]:
        """`ServerRunOptions.Validate`'s wording."""
        problems = Problems()
        if self.shutdown_delay_duration < 0:
            problems.add("--shutdown-delay-duration", "can not be negative value")
        if self.shutdown_watch_termination_grace_period < 0:
            problems.add("--shutdown-watch-termination-grace-period", "can not be a negative value")
        for flag, value in (
            ("--max-requests-inflight", self.max_requests_inflight),
            ("--max-mutating-requests-inflight", self.max_mutating_requests_inflight),
            ("--request-timeout", self.request_timeout),
            ("--min-request-timeout", self.min_request_timeout),
        ):
            if value < 0:
                problems.add(flag, "can not be negative value")
        return problems.errors

    def apply_to(self, config: ServerRunTarget) -> None:
        config.requests = RequestLimits(
            max_requests_inflight=self.max_requests_inflight,
            max_mutating_requests_inflight=self.max_mutating_requests_inflight,
            request_timeout=self.request_timeout,
            min_request_timeout=self.min_request_timeout,
        )
        config.shutdown = ShutdownConfig(
            delay=self.shutdown_delay_duration,
            watch_grace=self.shutdown_watch_termination_grace_period,
            request_grace=self.request_timeout,
        )


@dataclass(frozen=True)
class RequestLimits:
    """What the request path enforces: max-in-flight (`inflight.py`) and deadlines (`timeout.py`)."""

    max_requests_inflight: int = DEFAULT_MAX_REQUESTS_INFLIGHT
    max_mutating_requests_inflight: int = DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    min_request_timeout: float = DEFAULT_MIN_REQUEST_TIMEOUT


@dataclass(frozen=True)
class ShutdownConfig:
    """A graceful shutdown (`runners/server.py` `shut_down`): /readyz fails for `delay` with the
    listener open; then requests get `request_grace`, watches and tunnels `watch_grace`."""

    delay: float = 0.0
    watch_grace: float = 0.0
    request_grace: float = DEFAULT_REQUEST_TIMEOUT

    @property
    def drain(self) -> float:
        """The longest the drain after the delay takes (before the closes' own timeouts)."""
        return max(self.request_grace, self.watch_grace)


class ServerRunTarget(Protocol):
    requests: RequestLimits
    shutdown: ShutdownConfig


@dataclass
class LoggingOptions:
    format: str = "text"
    verbosity: int = 0
    access_log: str | None = None  # None: errors, or all from -v 3 (web/accesslog.py)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "logging", prefix)
        flags.add("--log-format", field="format", choices=["text", "json"], default="text", help="log line format.")
        flags.add(
            "-v",
            "--v",
            field="verbosity",
            metavar="VERBOSITY",
            type=int,
            default=0,
            help="log verbosity; 3 and above logs every request (unless --access-log says otherwise), 4 and "
            "above logs debug lines.",
        )
        flags.add(
            "--access-log",
            field="access_log",
            default=None,
            help="which requests get an access-log line: off, errors (5xx and clients that went away), "
            "sampled[:N] (one in N, default 100, plus errors) or all (default: errors, all with -v 3).",
        )

    def access_log_policy(self) -> AccessLogPolicy:
        try:
            return AccessLogPolicy.parse(self.access_log, verbosity=self.verbosity)
        except AccessLogError as err:
            raise ConfigError("--access-log", str(err)) from err

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        problems.check(self.access_log_policy)
        return problems.errors

    def apply_to(self, config: LoggingTarget) -> None:
        config.logging = LoggingConfig(self.format, self.verbosity, self.access_log_policy())


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "text"
    verbosity: int = 0
    access_log: AccessLogPolicy = field(default_factory=lambda: AccessLogPolicy("errors"))


class LoggingTarget(Protocol):
    logging: LoggingConfig
