"""React to a folder's changes within milliseconds: inotify through `watchfiles`, polling only as a fallback.

Polling a folder every second made a new manifest take up to a second to reach `/apis`, and a
poll reads every file's metadata whether anything changed or not (two watchers of a folder of
thousands of manifests). The `watchfiles` library (Rust `notify`: inotify on Linux) reports a
change as soon as it is written; a burst of events is batched for a few milliseconds, then
`on_change` runs once, and nothing runs while nothing changes. A Kubernetes ConfigMap or Secret
volume swaps a `..data` symlink to publish a new version: that is a change in the folder too, so
it is seen the same way.

If inotify cannot be used (no instances or watches left, an exotic filesystem), or the kernel's
watch ends because the folder itself was removed, the watcher says so once and polls the
fingerprint every `interval` from then on.
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
DEBOUNCE_MS = 100
STEP_MS = 50


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
        self._name = name
        self._poll = PollingWatcher(fingerprint, on_change, interval=interval, name=name, baseline_now=False)
        self._tasks = TaskSet(name)
        self.inotify = False  # whether events come from the kernel (for logs and tests)
        self.polling = False  # whether the fallback poll runs

    def start(self) -> None:
        # The state the caller just read: a fallback poll compares with it, so a change made
        # before inotify failed is not missed (one look at the folder, at start only).
        self._poll.prime()
        if self._use_inotify:
            self.inotify = True
            self._tasks.spawn(self._follow(), name="inotify")
        else:
            self._fall_back()

    async def stop(self) -> None:
        await self._tasks.close()
        await self._poll.stop()

    async def _follow(self) -> None:
        armed = False
        try:
            import watchfiles

            # `yield_on_timeout`: an empty batch every few seconds (watchfiles wakes its thread that
            # often anyway). The first one closes the gap between the caller's read and the kernel's
            # watch: one look at the folder; a first change does the same (the caller re-reads).
            async for changes in watchfiles.awatch(
                self.directory, watch_filter=None, debounce=DEBOUNCE_MS, step=STEP_MS, yield_on_timeout=True
            ):
                if not changes and armed:
                    continue
                armed = True
                try:
                    if changes:
                        self._on_change()
                    else:
                        await self._poll.check_now()
                except Exception:
                    log.exception("%s: handling a folder change failed", self._name)
                if not self.directory.is_dir():
                    reason = "the folder was removed, and its kernel watch with it"
                    break
            else:
                reason = "the kernel watch ended"
        except Exception as err:  # no inotify here
            reason = str(err) or type(err).__name__
        self.inotify = False
        log.warning(
            "cannot watch the folder for changes; polling it instead",
            extra=fields(directory=str(self.directory), watcher=self._name, reason=reason),
        )
        self._fall_back()

    def _fall_back(self) -> None:
        """Poll from now on, against the state read at `start`."""
        self.polling = True
        self._poll.start()
