"""Named, supervised background tasks: every task has a kept reference, a name, and a logged crash.

An asyncio task nobody holds can be garbage-collected mid-flight, and one that raises is only
reported when it is collected, if ever. Like kopf's `create_guarded_task`, a `TaskSet` keeps every
task it starts until it ends, logs an unexpected exception with the task's name at once, and
cancels what is left on `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from aggregator.util.logs import fields

log = logging.getLogger(__name__)

T = TypeVar("T")


class TaskSet:
    """The background tasks of one component."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        # Looked up once: on Python 3.11 every get_running_loop() is a getpid() syscall.
        self._loop: asyncio.AbstractEventLoop | None = None

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start `coro` now; it is kept until it ends, and a crash is logged with `name`."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(coro, name=f"{self.owner}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            log.error(
                "background task crashed",
                exc_info=(type(err), err, err.__traceback__),
                extra=fields(task=task.get_name()),
            )

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
