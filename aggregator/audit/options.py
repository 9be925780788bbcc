"""kube-apiserver's audit log flags (k8s.io/apiserver's `AuditOptions`: the log backend in batch
mode; docs/audit.md), with its defaults and refusals."""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from typing import Protocol

from aggregator.audit.policy import PolicyError, load_policy_file
from aggregator.util.flags import ConfigError, FlagSet, Problems

# kube-apiserver's audit log defaults since 1.36 (k8s.io/apiserver pkg/server/options/audit.go).
DEFAULT_AUDIT_LOG_MAXAGE = 366
DEFAULT_AUDIT_LOG_MAXBACKUP = 100
DEFAULT_AUDIT_LOG_MAXSIZE = 100
DEFAULT_AUDIT_LOG_BUFFER_SIZE = 10000


@dataclass
class AuditOptions:
    log_path: str | None = None
    policy_file: str | None = None
    log_maxage: int = DEFAULT_AUDIT_LOG_MAXAGE
    log_maxbackup: int = DEFAULT_AUDIT_LOG_MAXBACKUP
    log_maxsize: int = DEFAULT_AUDIT_LOG_MAXSIZE
    log_batch_buffer_size: int = DEFAULT_AUDIT_LOG_BUFFER_SIZE

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "auditing", prefix)
        flags.add(
            "--audit-log-path",
            field="log_path",
            help="write audit events (audit.k8s.io/v1 Event JSON lines) to this file; '-' means standard "
            "out. Nothing is audited without --audit-policy-file.",
        )
        flags.add(
            "--audit-policy-file",
            field="policy_file",
            help="audit.k8s.io/v1 Policy deciding which requests are audited at which level; nothing is "
            "audited without --audit-log-path.",
        )
        flags.add(
            "--audit-log-maxage",
            field="log_maxage",
            type=int,
            default=DEFAULT_AUDIT_LOG_MAXAGE,
            help="days to keep rotated audit log files, by the time in their name; 0 keeps them regardless "
            f"of age (default {DEFAULT_AUDIT_LOG_MAXAGE}).",
        )
        flags.add(
            "--audit-log-maxbackup",
            field="log_maxbackup",
            type=int,
            default=DEFAULT_AUDIT_LOG_MAXBACKUP,
            help=f"rotated audit log files to keep; 0 keeps all (default {DEFAULT_AUDIT_LOG_MAXBACKUP}).",
        )
        flags.add(
            "--audit-log-maxsize",
            field="log_maxsize",
            type=int,
            default=DEFAULT_AUDIT_LOG_MAXSIZE,
            help="megabytes an audit log file may reach before it is rotated; 0 disables rotation "
            f"(default {DEFAULT_AUDIT_LOG_MAXSIZE}).",
        )
        flags.add(
            "--audit-log-batch-buffer-size",
            field="log_batch_buffer_size",
            type=int,
            default=DEFAULT_AUDIT_LOG_BUFFER_SIZE,
            help="audit events queued for the writer; when it is full, new events are dropped and counted "
            f'in apiserver_audit_error_total{{plugin="buffered"}} (default {DEFAULT_AUDIT_LOG_BUFFER_SIZE}).',
        )

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        for flag, value in (
            ("--audit-log-maxage", self.log_maxage),
            ("--audit-log-maxbackup", self.log_maxbackup),
            ("--audit-log-maxsize", self.log_maxsize),
        ):
            if value < 0:
                problems.add(flag, f"{value} can't be a negative number")
        if self.log_batch_buffer_size <= 0:
            problems.add("--audit-log-batch-buffer-size", "must be a positive number")
        if self.policy_file is not None:
            try:
                load_policy_file(self.policy_file)
            except PolicyError as err:
                problems.add("--audit-policy-file", str(err))
        return problems.errors

    def apply_to(self, config: AuditTarget) -> None:
        """The auditor reads the flags as they are (`factory.build_auditor`): a copy."""
        config.audit = copy.copy(self)


class AuditTarget(Protocol):
    audit: AuditOptions
