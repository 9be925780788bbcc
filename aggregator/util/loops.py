"""One engine for every keyed background loop: discovery fetches, availability checks, OpenAPI downloads.

Each key (an APIService, a backend, kube-apiserver) runs `work(key)` at once when it is added or
poked (or within a given delay, `poke_within`), again `interval` after a success and after an
exponential backoff following a failure (client-go's `ItemExponentialFailureRateLimiter`), with
both waits jittered downwards so that thousands of keys added together drift apart instead of
firing in lockstep. A poke during a run means "run again right after". At most `concurrency` runs are in flight (upstream runs a fixed
number of workers per controller).

A key added or poked goes ahead of every periodic run, even overdue ones: when the periodic runs
fall behind (5000 APIServices re-checked every 30 s on a loaded machine), a new APIService, a
changed one or one the proxy suspects is checked at the next free slot instead of after the
backlog.

One scheduler task and at most `concurrency` run tasks exist however many keys there are: keys wait
in a heap of due times, not as sleeping tasks, so 5000 APIServices cost 5000 heap entries rather
than 5000 tasks with timers.

A wait of `ALIGN_FROM_TICKS` ticks or more (every periodic run and long retry) ends on a multiple of
`tick` of the loop's clock, shared by every `KeyedLoops` of the process. Jittered due times spread
5000 APIServices' checks, discovery fetches and OpenAPI refreshes evenly, so each run used to wake
the process on its own: a timer, a scheduler turn, a write, an `epoll_wait` for its one answer.
Ending on a shared tick, the runs due within it start in one turn of the event loop, their
requests leave together and their answers are read in the same few turns: measured on warm TLS
connections, a background GET alone cost 167-194 us of CPU, ten at a time 102 us each. A run moves
by less than one tick (0.1 s, a third of a percent of a 30 s period), so the periods stay
upstream's; runs asked for now or within a delay (a new key, a poke) and short waits are never
aligned.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from aggregator.util.backoff import exponential_delay
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# A key's next wait after a run, overriding the default: (key, ok, consecutive failures) -> seconds,
# or None for the default.
DelayHook = Callable[[K, bool, int], float | None]

CLOCK_SLACK = 0.002
# Long waits end on a multiple of this many seconds of the loop's clock (see the module's docstring).
TICK = 0.1
# Only waits of at least this many ticks are aligned: a run moves by under a tenth of its wait.
ALIGN_FROM_TICKS = 10
# A key's lane in the heap: runs asked for now go before periodic ones, overdue or not.
ASKED, PERIODIC = 0, 1


@dataclass(slots=True)
class _Entry:
    due: float | None  # when the next run is due; None while running
    running: bool = False
    again: bool = False  # poked during the run: run again right after
    failures: int = 0


class KeyedLoops(Generic[K]):
    def __init__(
        self,
        name: str,
        work: Callable[[K], Awaitable[bool]],
        *,
        interval: float,
        backoff_initial: float,
        backoff_max: float,
        concurrency: int,
        jitter: float = 0.1,
        delay: DelayHook[K] | None = None,
        rng: Callable[[], float] | None = None,
        tick: float = TICK,
    ) -> None:
        self.name = name
        self._work = work
        # Public and mutable: tests and operators' knobs read them at each scheduling decision.
        self.interval = interval
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.concurrency = concurrency
        self.jitter = jitter
        self.tick = tick
        self._delay_hook = delay
        self._rng = rng or random.Random().random
        self._entries: dict[K, _Entry] = {}
        # (lane, due, n, key): lane 0 for runs asked for now (a new key, a poke), ahead of lane 1
        # (periodic runs and retries) even when those are overdue.
        self._heap: list[tuple[int, float, int, K]] = []
        self._seq = itertools.count()
        # Woken by a due time or by a change; a plain future on the loop (an asyncio.Event looks the
        # running loop up on every wait, which costs a getpid() syscall on Python 3.11).
        self._wake: asyncio.Future[None] | None = None
        self._woken = False
        self._active = 0
        self._runs: dict[K, asyncio.Task[None]] = {}
        self._tasks = TaskSet(name)
        self._scheduler: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.runs = 0  # completed runs, for tests and metrics
        self.wakeups = 0  # scheduler iterations: a handful per run, never a spin

    # --- keys ------------------------------------------------------------------------------------

    def ensure(self, key: K) -> None:
        """Run `key` from now on, at once if it is new."""
        if key not in self._entries:
            entry = self._entries[key] = _Entry(due=None)
            self._schedule(key, entry, 0.0)

    def discard(self, key: K) -> None:
        """Stop running `key` (a run in progress is cancelled)."""
        self._entries.pop(key, None)
        run = self._runs.pop(key, None)
        if run is not None:
            run.cancel()

    def poke(self, key: K) -> None:
        """Run `key` now, or right after the run in progress."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.running:
            entry.again = True
        else:
            self._schedule(key, entry, 0.0)

    def poke_within(self, key: K, delay: float) -> None:
        """Run `key` within `delay` seconds: at its own due time if that is sooner, right after the
        run in progress if it is running (a rate-limited poke's trailing edge)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.running:
            entry.again = True
        elif entry.due is None or entry.due > self._now() + delay:
            self._schedule(key, entry, delay)

    def tracked(self) -> list[K]:
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def due(self, key: K) -> float | None:
        """When `key` runs next (loop time); None while it runs or when it is not tracked."""
        entry = self._entries.get(key)
        return entry.due if entry is not None else None

    def failures(self, key: K) -> int:
        entry = self._entries.get(key)
        return entry.failures if entry is not None else 0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = self._tasks.spawn(self._schedule_loop(), name="scheduler")

    async def stop(self) -> None:
        self._scheduler = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._runs.clear()
        await self._tasks.close()
        self._active = 0
        for entry in self._entries.values():  # a later start() runs every key again at once
            entry.running, entry.again = False, False
        self._heap = []
        for key, entry in self._entries.items():
            self._schedule(key, entry, 0.0)

    # --- scheduling ------------------------------------------------------------------------------

    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else 0.0

    def _schedule(self, key: K, entry: _Entry, delay: float, *, align: bool = False) -> None:
        due = self._now() + delay
        tick = self.tick
        if align and tick > 0 and delay >= ALIGN_FROM_TICKS * tick:
            due = math.ceil(due / tick) * tick  # with every other long wait of the process
        entry.due = due
        heapq.heappush(self._heap, (ASKED if delay <= 0 else PERIODIC, due, next(self._seq), key))
        if self._heap[0][3] == key or delay <= 0:
            self._set_wake()

    def _next_delay(self, key: K, ok: bool, failures: int) -> float:
        if self._delay_hook is not None:
            override = self._delay_hook(key, ok, failures)
            if override is not None:
                return override
        base = self.interval if ok else exponential_delay(failures, self.backoff_initial, self.backoff_max)
        return base * (1.0 - self.jitter * self._rng())

    def _set_wake(self) -> None:
        self._woken = True
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _schedule_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            self.wakeups += 1
            self._woken = False
            # Timers fire with the loop's clock resolution (1 ms in uvloop), possibly a little before
            # their time: what is due within it runs now instead of re-arming a timer in a tight spin.
            now = self._now() + CLOCK_SLACK
            while self._heap and self._active < self.concurrency:
                heap = self._heap
                _, due, _, key = heap[0]
                entry = self._entries.get(key)
                if entry is None or entry.running or entry.due != due:
                    heapq.heappop(heap)  # stale: discarded, running, or rescheduled since
                    continue
                if due > now:
                    break
                heapq.heappop(heap)
                entry.running, entry.due = True, None
                self._active += 1
                # A task named after its key, when the key is a name: `str` of a tuple key (an
                # OpenAPI source's, which holds its caBundle) would write kilobytes per run.
                name = key if isinstance(key, str) else "run"
                self._runs[key] = self._tasks.spawn(self._run(key, entry), name=name)
            if self._heap and self._active < self.concurrency:
                self._wake_at(self._heap[0][1])
            if not self._woken:
                self._wake = loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None

    def _wake_at(self, due: float) -> None:
        """One timer for the earliest due key (cheaper than a timeout context per wait)."""
        timer = self._timer
        if timer is not None and not timer.cancelled() and timer.when() <= due:
            return
        if timer is not None:
            timer.cancel()
        assert self._loop is not None
        self._timer = self._loop.call_at(due, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._set_wake()

    async def _run(self, key: K, entry: _Entry) -> None:
        ok = False
        try:
            ok = await self._work(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background run failed", extra=fields(loop=self.name, key=str(key)))
        finally:
            # The scheduler parks without a timer while every slot is taken: a slot freed then
            # wakes it. Otherwise its timer is armed, and only a key already due needs it now.
            was_full = self._active >= self.concurrency
            self._active -= 1
            if self._runs.get(key) is asyncio.current_task(self._loop):
                del self._runs[key]
            heap = self._heap
            if was_full or (heap and heap[0][1] <= self._now() + CLOCK_SLACK):
                self._set_wake()
        self.runs += 1
        if self._entries.get(key) is not entry:
            return  # discarded (or replaced) while it ran
        entry.running = False
        entry.failures = 0 if ok else entry.failures + 1
        if entry.again:
            entry.again = False
            self._schedule(key, entry, 0.0)
        else:
            self._schedule(key, entry, self._next_delay(key, ok, entry.failures), align=True)


class LoopKnob:
    """A knob of a component's `KeyedLoops`, read and written through (tests shorten them; the
    engine reads them at each scheduling decision): `retry_initial = LoopKnob("backoff_initial")`."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute

    def __get__(self, component: HasLoops, owner: object = None) -> float:
        value: float = getattr(component.loops, self.attribute)
        return value

    def __set__(self, component: HasLoops, value: float) -> None:
        setattr(component.loops, self.attribute, value)


class HasLoops(Protocol):
    loops: KeyedLoops[Any]


class LoopComponent:
    """A component whose background work is one `KeyedLoops`: its knobs, and its start and stop."""

    loops: KeyedLoops[Any]

    refresh_interval = LoopKnob("interval")
    backoff_initial = LoopKnob("backoff_initial")
    backoff_max = LoopKnob("backoff_max")

    async def start(self) -> None:
        self.loops.start()

    async def stop(self) -> None:
        await self.loops.stop()
