"""Where audit lines go: standard output, a plain file, or a file rotated like lumberjack.

kube-apiserver writes its audit log through `gopkg.in/natefinch/lumberjack.v2` `Logger`
(`k8s.io/apiserver/pkg/server/options/audit.go AuditLogOptions.getWriter`). `RotatingFile` is a
port of it, so rotated files carry the names operators' log shippers already match:
`<name>-<UTC time as 2006-01-02T15-04-05.000><ext>` next to the active file. A write that would
take the file past `max_bytes` first renames it to such a backup and starts a new one with the
same permissions; then backups beyond `max_backups` (newest kept) and those whose name is more
than `max_age_days` old are deleted. Zero disables either limit. Every method runs on the audit
writer thread only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

MEGABYTE = 1024 * 1024
_BACKUP_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}")
_COMPRESS_SUFFIX = ".gz"


class LineSink(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def utc_now() -> datetime:
    return datetime.now(UTC)


class StdoutSink:
    """`--audit-log-path=-`. `sys.stdout` is looked up at each write, so a redirected stdout is honoured."""

    def write(self, data: bytes) -> None:
        stream = sys.stdout.buffer
        stream.write(data)
        stream.flush()

    def close(self) -> None:
        sys.stdout.flush()


def ensure_log_file(path: str) -> None:
    """`AuditLogOptions.ensureLogFile`: create the folder (0700) and the file (0600) up front, so a
    path the gateway cannot write fails at start rather than at the first event."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except FileExistsError as err:  # a file where a folder should be (Go's MkdirAll says ENOTDIR)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), folder) from err
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_RDWR, 0o600)
    os.close(fd)


class AppendFile:
    """`--audit-log-maxsize=0`: one file, appended to, never rotated (as kube-apiserver since 1.36)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def write(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
        _write_all(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _go_ext(filename: str) -> str:
    """`filepath.Ext`: from the last dot of the base name (`.hidden` is all extension)."""
    dot = filename.rfind(".")
    return filename[dot:] if dot >= 0 else ""


@dataclass(frozen=True, slots=True)
class _Backup:
    name: str
    timestamp: datetime


class RotatingFile:
    """lumberjack's `Logger` (Write, rotate, openNew, backupName, millRunOnce) with UTC names."""

    def __init__(
        self,
        path: str,
        *,
        max_bytes: int,
        max_backups: int = 0,
        max_age_days: int = 0,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.path = path
        self.max_bytes = max_bytes
        self.max_backups = max_backups
        self.max_age_days = max_age_days
        self._now = now
        self._fd: int | None = None
        self._size = 0
        base = os.path.basename(path)
        self._ext = _go_ext(base)
        self._prefix = base[: len(base) - len(self._ext)] + "-"
        self._dir = os.path.dirname(os.path.abspath(path))

    def write(self, data: bytes) -> None:
        if len(data) > self.max_bytes:
            raise ValueError(f"write length {len(data)} exceeds maximum file size {self.max_bytes}")
        if self._fd is None:
            self._open_existing_or_new(len(data))
        elif self._size + len(data) > self.max_bytes:
            self._rotate()
        assert self._fd is not None
        self._size += _write_all(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def backup_name(self) -> str:
        """`backupName`: `<prefix>-<UTC 2006-01-02T15-04-05.000><ext>`."""
        moment = self._now().astimezone(UTC)
        stamp = moment.strftime("%Y-%m-%dT%H-%M-%S.") + f"{moment.microsecond // 1000:03d}"
        return os.path.join(self._dir, f"{self._prefix}{stamp}{self._ext}")

    def _open_existing_or_new(self, write_len: int) -> None:
        self._mill()
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._open_new()
            return
        if info.st_size + write_len >= self.max_bytes:
            self._rotate()
            return
        try:
            self._fd = os.open(self.path, os.O_APPEND | os.O_WRONLY)
        except OSError:
            self._open_new()
            return
        self._size = info.st_size

    def _rotate(self) -> None:
        self.close()
        self._open_new()
        self._mill()

    def _open_new(self) -> None:
        os.makedirs(self._dir, mode=0o755, exist_ok=True)
        mode = 0o600
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            pass
        else:
            mode = info.st_mode & 0o7777
            os.replace(self.path, self.backup_name())
        self._fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode)
        self._size = 0

    def _backups(self) -> list[_Backup]:
        """`oldLogFiles`: backups (and `.gz` backups) of this file, newest first."""
        found = []
        for entry in os.scandir(self._dir):
            if not entry.is_file(follow_symlinks=False):
                continue
            for ext in (self._ext, self._ext + _COMPRESS_SUFFIX):
                name = entry.name
                if not (name.startswith(self._prefix) and name.endswith(ext)):
                    continue
                stamp = name[len(self._prefix) : len(name) - len(ext)]
                if _BACKUP_TIME.fullmatch(stamp):
                    moment = datetime.strptime(stamp, "%Y-%m-%dT%H-%M-%S.%f").replace(tzinfo=UTC)
                    found.append(_Backup(name, moment))
                    break
        found.sort(key=lambda b: b.timestamp, reverse=True)
        return found

    def _mill(self) -> None:
        """`millRunOnce` (synchronously: this is the writer thread already)."""
        if self.max_backups == 0 and self.max_age_days == 0:
            return
        files = self._backups()
        remove: list[_Backup] = []
        if 0 < self.max_backups < len(files):
            preserved: set[str] = set()
            remaining: list[_Backup] = []
            for backup in files:
                preserved.add(backup.name.removesuffix(_COMPRESS_SUFFIX))
                (remove if len(preserved) > self.max_backups else remaining).append(backup)
            files = remaining
        if self.max_age_days > 0:
            cutoff = self._now().astimezone(UTC) - timedelta(days=self.max_age_days)
            remove.extend(b for b in files if b.timestamp < cutoff)
        for backup in remove:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self._dir, backup.name))
