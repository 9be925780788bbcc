"""React to a folder's changes within milliseconds: inotify through `watchfiles`, polling as a net.

Polling a folder every second made a new manifest take up to a second to reach `/apis`. The
`watchfiles` library (Rust `notify`: inotify on Linux) reports a change as soon as it is written;
a burst of events is batched for a few milliseconds, then `on_change` runs once. A Kubernetes
ConfigMap or Secret volume swaps a `..data` symlink to publish a new version: that is a change in
the folder too, so it is seen the same way. If inotify cannot be used (no watches left, an exotic
filesystem), the watcher says so once and polls instead; a slow poll also runs beside inotify, in
case an event queue overflows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from aggregator.util.filewatch import Fingerprint, PollingWatcher
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

# watchfiles groups events for at most DEBOUNCE ms, yielding STEP ms after the last one.
DEBOUNCE_MS = 50
STEP_MS = 5
# The safety-net poll beside inotify; alone (no inotify), the poll runs every `interval`.
NET_INTERVAL = 10.0


class DirectoryWatcher:
    def __init__(
        self,
        directory: Path,
        fingerprint: Callable[[], Fingerprint],
        on_change: Callable[[], None],
        *,
        interval: float = 1.0,
        name: str = "directory",
        use_inotify: bool = True,
    ) -> None:
        self.directory = directory
        self._on_change = on_change
        self._use_inotify = use_inotify
        self._interval = interval
        self._poll = PollingWatcher(fingerprint, on_change, interval=interval, name=name)
        self._tasks = TaskSet(name)
        self.inotify = False  # whether events come from the kernel (for logs and tests)

    def start(self) -> None:
        self._poll.prime()
        if self._use_inotify:
            self._poll.interval = max(self._interval, NET_INTERVAL)
            self._tasks.spawn(self._follow(), name="inotify")
        self._poll.start()

    async def stop(self) -> None:
        await self._tasks.close()
        await self._poll.stop()

    async def _follow(self) -> None:
        try:
            import watchfiles

            self.inotify = True
            async for _changes in watchfiles.awatch(
                self.directory, watch_filter=None, debounce=DEBOUNCE_MS, step=STEP_MS
            ):
                self._poll.prime()  # the net need not fire for what was just handled
                self._on_change()
        except Exception as err:  # no inotify here: poll as often as the caller asked
            self.inotify = False
            log.warning(
                "cannot watch the folder for changes; polling it instead",
                extra=fields(directory=str(self.directory), reason=str(err) or type(err).__name__),
            )
            self._poll.interval = self._interval
