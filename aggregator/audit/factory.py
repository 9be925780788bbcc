"""Turn the `--audit-*` flags into an Auditor, or into nothing, exactly when kube-apiserver would.

`k8s.io/apiserver/pkg/server/options/audit.go AuditOptions.ApplyTo`: without `--audit-log-path`
there is no log backend; with a path but no `--audit-policy-file` the backend is not created and
nothing is audited (upstream only says so at verbosity 2; we warn, since it is likely a mistake);
a policy without a path audits nothing either. The log file is created (folder 0700, file 0600)
before serving starts, so an unwritable path stops the start-up (`ensureLogFile`).
"""

from __future__ import annotations

import logging

from aggregator.audit.options import AuditOptions
from aggregator.audit.policy import PolicyError, load_policy_file
from aggregator.audit.recorder import AuditMetrics, Auditor
from aggregator.audit.sinks import MEGABYTE, AppendFile, LineSink, RotatingFile, StdoutSink, ensure_log_file
from aggregator.audit.writer import BufferedWriter
from aggregator.util.flags import ConfigError
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


def open_sink(path: str, *, max_size_mb: int, max_backups: int, max_age_days: int) -> LineSink:
    """`AuditLogOptions.getWriter`: stdout for `-`, a plain file when rotation is off, else lumberjack."""
    if path == "-":
        return StdoutSink()
    ensure_log_file(path)
    if max_size_mb == 0:
        return AppendFile(path)
    return RotatingFile(
        path, max_bytes=max_size_mb * MEGABYTE, max_backups=max_backups, max_age_days=max_age_days
    )


def build_auditor(opts: AuditOptions, metrics: AuditMetrics, *, sink: LineSink | None = None) -> Auditor | None:
    """The gateway's Auditor (not started), or None when the flags audit nothing. Raises
    ConfigError (exit code 2, one line) for a bad policy file or an unwritable log path. `sink`
    replaces the log file (a `--workers` worker hands its lines to the control process; the
    start-up lines are then the control's to log)."""
    quiet = sink is not None
    if not opts.log_path:
        if quiet:
            return None
        if opts.policy_file:
            log.warning(
                "--audit-policy-file is set without --audit-log-path: no audit events will be written"
            )
        return None
    if not opts.policy_file:
        if quiet:
            return None
        log.warning(
            "--audit-log-path is set without --audit-policy-file: no audit events will be recorded "
            "(as kube-apiserver)",
            extra=fields(path=opts.log_path),
        )
        return None
    try:
        policy = load_policy_file(opts.policy_file)
    except PolicyError as err:
        raise ConfigError("--audit-policy-file", str(err)) from err
    if sink is not None:
        return Auditor(
            policy,
            BufferedWriter(sink, metrics.errors, buffer_size=opts.log_batch_buffer_size),
            metrics,
        )
    try:
        sink = open_sink(
            opts.log_path,
            max_size_mb=opts.log_maxsize,
            max_backups=opts.log_maxbackup,
            max_age_days=opts.log_maxage,
        )
    except OSError as err:
        raise ConfigError(
            "--audit-log-path", f"cannot create {opts.log_path}: {err.strerror or err}"
        ) from err
    writer = BufferedWriter(sink, metrics.errors, buffer_size=opts.log_batch_buffer_size)
    log.info(
        "auditing",
        extra=fields(path=opts.log_path, policy=opts.policy_file, rules=len(policy.rules)),
    )
    return Auditor(policy, writer, metrics)
