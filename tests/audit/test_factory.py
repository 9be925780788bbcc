"""The `--audit-*` flags: when they audit, where to, and the one-line error for a bad policy."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from aggregator.audit.factory import build_auditor
from aggregator.audit.recorder import AuditMetrics, Auditor
from aggregator.audit.sinks import AppendFile, LineSink, RotatingFile, StdoutSink
from aggregator.audit.writer import BufferedWriter
from aggregator.commands.cli import build_parser
from aggregator.config import Options, options_from_args, validate
from aggregator.model.userinfo import UserInfo
from aggregator.util.flags import ConfigError
from tests.audit.support import info_of, mocked_request, policy_for
from tests.support.options import flag_options


def metrics() -> AuditMetrics:
    return AuditMetrics(CollectorRegistry())


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_for("Metadata"))
    return path


def options(tmp_path: Path, **flags: object) -> Options:
    folder = tmp_path / "apiservices"
    folder.mkdir(exist_ok=True)
    return flag_options(apiservices_dir=str(folder), **flags)


def test_flags_and_defaults_follow_kube_apiserver() -> None:
    args = build_parser().parse_args(["serve"])
    opts = options_from_args(args)
    assert (opts.audit.log_path, opts.audit.policy_file) == (None, None)
    assert (opts.audit.log_maxage, opts.audit.log_maxbackup, opts.audit.log_maxsize) == (366, 100, 100)
    assert opts.audit.log_batch_buffer_size == 10000
    args = build_parser().parse_args(
        [
            "serve",
            "--audit-log-path",
            "-",
            "--audit-policy-file",
            "p.yaml",
            "--audit-log-maxage",
            "7",
            "--audit-log-maxbackup",
            "3",
            "--audit-log-maxsize",
            "0",
            "--audit-log-batch-buffer-size",
            "50",
        ]
    )
    opts = options_from_args(args)
    assert (opts.audit.log_path, opts.audit.policy_file) == ("-", "p.yaml")
    assert (opts.audit.log_maxage, opts.audit.log_maxbackup, opts.audit.log_maxsize) == (7, 3, 0)
    assert opts.audit.log_batch_buffer_size == 50


def test_nothing_is_audited_without_both_path_and_policy(
    tmp_path: Path, policy_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert build_auditor(options(tmp_path).audit, metrics()) is None
    with caplog.at_level(logging.WARNING):
        assert build_auditor(options(tmp_path, audit_log_path=str(tmp_path / "a.log")).audit, metrics()) is None
        assert build_auditor(options(tmp_path, audit_policy_file=str(policy_file)).audit, metrics()) is None
    assert (
        "--audit-log-path is set without --audit-policy-file: no audit events will be recorded" in caplog.text
    )
    assert "--audit-policy-file is set without --audit-log-path" in caplog.text
    assert not (tmp_path / "a.log").exists()


def test_log_file_and_rotation_settings(tmp_path: Path, policy_file: Path) -> None:
    path = tmp_path / "logs" / "audit.log"
    opts = options(
        tmp_path,
        audit_log_path=str(path),
        audit_policy_file=str(policy_file),
        audit_log_maxsize=5,
        audit_log_maxbackup=3,
        audit_log_maxage=7,
    )
    auditor = build_auditor(opts.audit, metrics())
    assert auditor is not None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # created before serving starts
    sink = sink_of(auditor)
    assert isinstance(sink, RotatingFile)
    assert (sink.max_bytes, sink.max_backups, sink.max_age_days) == (5 * 1024 * 1024, 3, 7)
    no_rotation = build_auditor(replace(opts.audit, log_maxsize=0), metrics())
    assert no_rotation is not None
    assert isinstance(sink_of(no_rotation), AppendFile)


def sink_of(auditor: Auditor) -> LineSink:
    """Where build_auditor's writer writes: the BufferedWriter's sink."""
    writer = auditor.writer
    assert isinstance(writer, BufferedWriter)
    return writer._sink


def test_unwritable_log_path_stops_the_start(tmp_path: Path, policy_file: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    opts = options(tmp_path, audit_log_path=str(blocker / "audit.log"), audit_policy_file=str(policy_file))
    with pytest.raises(ConfigError, match=r"^--audit-log-path: cannot create .*audit\.log: Not a directory$"):
        build_auditor(opts.audit, metrics())


def test_dash_writes_events_to_stdout(
    tmp_path: Path, policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auditor = build_auditor(
        options(tmp_path, audit_log_path="-", audit_policy_file=str(policy_file)).audit, metrics()
    )
    assert auditor is not None
    assert isinstance(sink_of(auditor), StdoutSink)
    auditor.start()
    request = mocked_request("GET", "/apis/wardle.example.com/v1alpha1/flunders")
    recorded = auditor.begin(request, UserInfo("alice"), info_of(request))
    assert recorded is not None
    recorded.complete(200)
    assert auditor.stop(timeout=10)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["stage"] for line in lines] == ["RequestReceived", "ResponseComplete"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"audit_log_maxage": -1}, "--audit-log-maxage: -1 can't be a negative number"),
        ({"audit_log_maxbackup": -1}, "--audit-log-maxbackup: -1 can't be a negative number"),
        ({"audit_log_maxsize": -1}, "--audit-log-maxsize: -1 can't be a negative number"),
        ({"audit_log_batch_buffer_size": 0}, "--audit-log-batch-buffer-size: must be a positive number"),
    ],
)
def test_bad_numbers_are_refused(tmp_path: Path, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(options(tmp_path, **overrides))
    assert str(caught.value) == message


def test_bad_policy_names_the_file_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_for("Everything"))
    with pytest.raises(ConfigError) as caught:
        validate(options(tmp_path, audit_policy_file=str(path)))
    assert str(caught.value) == (
        f'--audit-policy-file: {path}: rules[0].level: Unsupported value: "Everything": supported values: '
        '"None", "Metadata", "Request", "RequestResponse"'
    )


def test_serve_with_a_bad_policy_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []\n")
    folder = tmp_path / "apiservices"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggregator",
            "serve",
            "--apiservices-dir",
            str(folder),
            "--audit-log-path",
            str(tmp_path / "audit.log"),
            "--audit-policy-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr
        == f"aggregator serve: --audit-policy-file: {path}: loaded illegal policy with 0 rules\n"
    )
