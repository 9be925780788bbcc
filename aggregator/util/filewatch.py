"""Noticing changed files without inotify: poll a cheap fingerprint.

Kubernetes Secret and ConfigMap mounts swap a `..data` symlink, which inotify on the file itself
misses; `stat` through the symlink (inode, size, mtime) sees it. Polling every second costs a few
syscalls and works everywhere, including in tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

Fingerprint = tuple[object, ...]


def stat_fingerprint(paths: Sequence[str | os.PathLike[str]]) -> Fingerprint:
    """(inode, size, mtime) of each path after following symlinks; a missing file counts as a state."""
    out: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError as err:
            out.append(("missing", err.errno))
    return tuple(out)


class PollingWatcher:
    """Calls `on_change` whenever `fingerprint()` differs from its last value."""

    def __init__(
        self,
        fingerprint: Callable[[], Fingerprint],
        on_change: Callable[[], Awaitable[None] | None],
        *,
        interval: float = 1.0,
        name: str = "watcher",
        baseline_now: bool = True,
    ) -> None:
        self._fingerprint = fingerprint
        self._on_change = on_change
        self.interval = interval
        self._name = name
        # The files' state as they are about to be read: an owner builds its watcher before it
        # reads them, so a change made between that read and `start` (a worker starts seconds
        # later) is a change the first poll sees, not the baseline it compares with. (An owner
        # that reads just before `start`, as DirectoryWatcher's, primes there instead.)
        self._last: Fingerprint | None = fingerprint() if baseline_now else None
        self._tasks = TaskSet(name)

    def prime(self) -> None:
        """Record the current state so only later changes fire."""
        self._last = self._fingerprint()

    def start(self) -> None:
        if self._last is None:
            self.prime()
        if not len(self._tasks):
            self._tasks.spawn(self._run(), name="poll")

    async def stop(self) -> None:
        await self._tasks.close()

    async def check_now(self) -> bool:
        """Compare once; returns True when a change was handled."""
        current = self._fingerprint()
        if current == self._last:
            return False
        self._last = current
        result = self._on_change()
        if result is not None:
            await result
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_now()
            except Exception:
                log.exception("%s: handling a file change failed", self._name)
