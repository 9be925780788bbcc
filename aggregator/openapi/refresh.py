"""A refresh loop per key: at once when poked, every `interval` after a success, backoff after a failure.

The discovery fetcher's schedule (a task per key, a wake event, a shared concurrency limit), for
keys that are not APIServices: OpenAPI is downloaded once per backend Service (several APIServices
of one server share it, user-needs §1.11) and once from kube-apiserver. A poke during a run means
"run again right after"; a failure doubles the wait from `backoff_initial` up to `backoff_max`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from aggregator.util.backoff import exponential_delay

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


@dataclass
class _Loop:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    failures: int = 0


class Refresher(Generic[K]):
    def __init__(
        self,
        run: Callable[[K], Awaitable[bool]],
        *,
        interval: float = 60.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        concurrency: int = 4,
        name: str = "refresh",
    ) -> None:
        self._run = run
        self.interval = interval
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._semaphore = asyncio.Semaphore(concurrency)
        self._name = name
        self._loops: dict[K, _Loop] = {}
        self._running = False

    def tracked(self) -> list[K]:
        return list(self._loops)

    def failures(self, key: K) -> int:
        loop = self._loops.get(key)
        return loop.failures if loop is not None else 0

    def start(self) -> None:
        self._running = True
        for key in self._loops:
            self._spawn(key)

    async def stop(self) -> None:
        self._running = False
        tasks = [loop.task for loop in self._loops.values() if loop.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ensure(self, key: K) -> None:
        """Refresh `key` from now on (at once if it is new)."""
        if key not in self._loops:
            self._loops[key] = _Loop()
            if self._running:
                self._spawn(key)

    def discard(self, key: K) -> None:
        loop = self._loops.pop(key, None)
        if loop is not None and loop.task is not None:
            loop.task.cancel()

    def poke(self, key: K) -> None:
        """Refresh `key` now (or right after the refresh in progress)."""
        loop = self._loops.get(key)
        if loop is not None:
            loop.wake.set()

    def _spawn(self, key: K) -> None:
        loop = self._loops[key]
        if loop.task is None or loop.task.done():
            loop.task = asyncio.get_running_loop().create_task(
                self._loop(key, loop), name=f"{self._name}:{key}"
            )

    async def _loop(self, key: K, loop: _Loop) -> None:
        while True:
            loop.wake.clear()
            async with self._semaphore:
                try:
                    ok = await self._run(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("refresh failed", extra={"key": str(key)})
                    ok = False
            loop.failures = 0 if ok else loop.failures + 1
            delay = (
                self.interval
                if ok
                else exponential_delay(loop.failures, self.backoff_initial, self.backoff_max)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), delay)
