"""Audit log files: lumberjack's size rotation, backup names, maxbackup and maxage; stdout."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from aggregator.audit.sinks import AppendFile, RotatingFile, StdoutSink, ensure_log_file
from tests.audit.support import Clock

START = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def line(n: int, width: int = 30) -> bytes:
    return f"{n:0{width - 1}d}\n".encode()


def every_second() -> Clock:
    return Clock(START + timedelta(seconds=i) for i in range(1000))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_rotates_before_a_write_that_would_pass_max_size(tmp_path: Path) -> None:
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=100, now=every_second())
    for n in range(4):  # 3 x 30 bytes fit; the 4th would make 120
        log.write(line(n))
    log.close()
    assert names(tmp_path) == ["audit-2026-03-01T12-00-00.123.log", "audit.log"]
    assert (tmp_path / "audit-2026-03-01T12-00-00.123.log").read_bytes() == line(0) + line(1) + line(2)
    assert (tmp_path / "audit.log").read_bytes() == line(3)


def test_exactly_max_size_fits_while_writing(tmp_path: Path) -> None:
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=90, now=every_second())
    for n in range(3):
        log.write(line(n))
    log.close()
    assert names(tmp_path) == ["audit.log"]


def test_an_existing_file_is_appended_to_or_rotated_at_open(tmp_path: Path) -> None:
    """lumberjack's openExistingOrNew rotates when existing size + write >= max (>, while writing)."""
    path = tmp_path / "audit.log"
    path.write_bytes(line(0) * 2)
    log = RotatingFile(str(path), max_bytes=100, now=every_second())
    log.write(line(1))
    log.close()
    assert names(tmp_path) == ["audit.log"]
    log = RotatingFile(str(path), max_bytes=100, now=every_second())
    log.write(line(2) + b"x" * 10)  # 90 + 40 >= 100
    log.close()
    assert names(tmp_path) == ["audit-2026-03-01T12-00-00.123.log", "audit.log"]
    assert path.read_bytes() == line(2) + b"x" * 10


def test_a_write_larger_than_max_size_is_refused(tmp_path: Path) -> None:
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=10, now=every_second())
    with pytest.raises(ValueError, match="write length 30 exceeds maximum file size 10"):
        log.write(line(0))


def test_maxbackup_keeps_the_newest(tmp_path: Path) -> None:
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=30, max_backups=2, now=every_second())
    for n in range(6):  # every write after the first rotates
        log.write(line(n))
    log.close()
    assert names(tmp_path) == [
        "audit-2026-03-01T12-00-03.123.log",
        "audit-2026-03-01T12-00-04.123.log",
        "audit.log",
    ]
    assert (tmp_path / "audit-2026-03-01T12-00-04.123.log").read_bytes() == line(4)


def test_compressed_backups_count_and_unrelated_files_stay(tmp_path: Path) -> None:
    for name in (
        "audit-2026-02-01T00-00-00.000.log.gz",
        "audit-2026-02-02T00-00-00.000.log",
        "audit-2026-02-04T00-00-00.000.log",
        "audit-not-a-time.log",
        "audit-2026-02-03T00-00-00.log",  # lumberjack's time format has milliseconds
        "other.log",
    ):
        (tmp_path / name).write_bytes(b"old\n")
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=30, max_backups=2, now=every_second())
    log.write(line(0))  # opening mills: the .gz backup is the third newest
    log.close()
    assert names(tmp_path) == [
        "audit-2026-02-02T00-00-00.000.log",
        "audit-2026-02-03T00-00-00.log",
        "audit-2026-02-04T00-00-00.000.log",
        "audit-not-a-time.log",
        "audit.log",
        "other.log",
    ]


def test_maxage_deletes_backups_named_older_than_the_cutoff(tmp_path: Path) -> None:
    old = START - timedelta(days=3, seconds=1)
    recent = START - timedelta(days=2)
    for moment in (old, recent):
        stamp = moment.strftime("%Y-%m-%dT%H-%M-%S.") + f"{moment.microsecond // 1000:03d}"
        (tmp_path / f"audit-{stamp}.log").write_bytes(b"old\n")
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=100, max_age_days=3, now=every_second())
    log.write(line(0))
    log.close()
    assert names(tmp_path) == ["audit-2026-02-27T12-00-00.123.log", "audit.log"]


def test_names_without_an_extension(tmp_path: Path) -> None:
    log = RotatingFile(str(tmp_path / "audit"), max_bytes=30, now=every_second())
    log.write(line(0))
    log.write(line(1))
    log.close()
    assert names(tmp_path) == ["audit", "audit-2026-03-01T12-00-00.123"]


def test_backup_names_use_utc(tmp_path: Path) -> None:
    moment = datetime(2026, 3, 1, 14, 30, 0, 999999, tzinfo=UTC).astimezone()
    log = RotatingFile(str(tmp_path / "audit.log"), max_bytes=30, now=lambda: moment)
    assert log.backup_name() == str(tmp_path / "audit-2026-03-01T14-30-00.999.log")


def test_log_file_is_created_private_and_rotation_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "audit.log"
    ensure_log_file(str(path))
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    log = RotatingFile(str(path), max_bytes=30, now=every_second())
    log.write(line(0))
    log.write(line(1))
    log.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_append_file_never_rotates(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(b"before\n")
    log = AppendFile(str(path))
    for n in range(100):
        log.write(line(n))
    log.close()
    assert names(tmp_path) == ["audit.log"]
    assert path.read_bytes() == b"before\n" + b"".join(line(n) for n in range(100))


def test_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink()
    sink.write(b'{"kind":"Event"}\n')
    sink.close()
    assert capsys.readouterr().out == '{"kind":"Event"}\n'
