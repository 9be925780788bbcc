"""The keyed background-loop engine: wake, interval, backoff, concurrency, and its cost per key."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from aggregator.util.loops import KeyedLoops
from tests.support.polling import until


def engine(
    work: Callable[[str], Awaitable[bool]],
    *,
    interval: float = 60.0,
    backoff: float = 0.02,
    cap: float = 0.08,
    concurrency: int = 4,
) -> KeyedLoops[str]:
    return KeyedLoops(
        "test",
        work,
        interval=interval,
        backoff_initial=backoff,
        backoff_max=cap,
        concurrency=concurrency,
        rng=lambda: 0.0,  # no jitter: these tests measure the schedule itself
    )


async def test_a_new_key_runs_at_once_then_every_interval() -> None:
    runs: list[float] = []

    async def work(_key: str) -> bool:
        runs.append(asyncio.get_running_loop().time())
        return True

    loops = engine(work, interval=0.05)
    loops.ensure("a")
    started = asyncio.get_running_loop().time()
    loops.start()
    try:
        await until(lambda: len(runs) >= 4, what="four runs")
    finally:
        await loops.stop()
    assert runs[0] - started < 0.05
    assert all(b - a >= 0.045 for a, b in itertools.pairwise(runs))


async def test_failures_back_off_exponentially_to_the_cap_and_a_success_resets() -> None:
    runs: list[float] = []
    results = iter([False] * 7 + [True])

    async def work(_key: str) -> bool:
        runs.append(asyncio.get_running_loop().time())
        return next(results, True)

    loops = engine(work, interval=0.3, backoff=0.02, cap=0.06)
    loops.ensure("a")
    loops.start()
    try:
        await until(lambda: len(runs) >= 9, what="nine runs")
    finally:
        await loops.stop()
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    # seven failures: 0.02, 0.04, then the 0.06 cap (uncapped: 0.08, 0.16, 0.32, 0.64, 1.28)
    assert gaps[0] >= 0.019 and gaps[1] >= 0.039
    assert all(gap >= 0.059 for gap in gaps[2:7])
    # a stall can stretch one gap, not three: an uncapped backoff never goes below 0.32 here
    assert min(gaps[4:7]) < 0.3
    assert gaps[7] >= 0.29  # after a success: the interval
    assert loops.failures("a") == 0


async def test_a_poke_during_a_run_runs_again_right_after() -> None:
    gate = asyncio.Event()
    runs = 0

    async def work(_key: str) -> bool:
        nonlocal runs
        runs += 1
        if runs == 1:
            await gate.wait()
        return True

    loops = engine(work, interval=60.0)
    loops.ensure("a")
    loops.start()
    try:
        await until(lambda: runs == 1, what="the first run")
        loops.poke("a")
        loops.poke("a")  # several pokes during one run mean one more run, not several
        gate.set()
        await until(lambda: runs == 2, what="the run after the poke")
        await asyncio.sleep(0.05)  # a negative check: time for a third run that must not come
        assert runs == 2
        loops.poke("a")
        await until(lambda: runs == 3, what="a run for a poke while idle")
    finally:
        await loops.stop()


async def test_poke_within_brings_a_later_run_forward_and_never_delays_one() -> None:
    runs: list[tuple[str, float]] = []
    gate = asyncio.Event()
    gate.set()

    async def work(key: str) -> bool:
        runs.append((key, asyncio.get_running_loop().time()))
        await gate.wait()
        return True

    loops = engine(work, interval=60.0)
    loops.ensure("a")
    loops.start()
    try:
        await until(lambda: len(runs) == 1, what="the first run")
        asked = asyncio.get_running_loop().time()
        loops.poke_within("a", 0.2)  # due in 60 s: now due in 0.2 s
        loops.poke_within("a", 30.0)  # a later bound does not push it back
        loops.poke_within("unknown", 0.0)
        await until(lambda: len(runs) == 2, what="the run brought forward")
        assert 0.19 <= runs[1][1] - asked < 1.0
        gate.clear()
        loops.poke("a")
        await until(lambda: len(runs) == 3, what="a run in progress")
        loops.poke_within("a", 30.0)  # during a run: right after it, as a poke
        gate.set()
        await until(lambda: len(runs) == 4, what="the run right after")
    finally:
        await loops.stop()


async def test_at_most_concurrency_runs_at_a_time() -> None:
    running = 0
    peak = 0
    done: Counter[str] = Counter()

    async def work(key: str) -> bool:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)  # the run takes a moment, so runs overlap
        running -= 1
        done[key] += 1
        return True

    loops = engine(work, concurrency=3)
    for i in range(20):
        loops.ensure(f"k{i}")
    loops.start()
    try:
        await until(lambda: len(done) == 20, what="every key's first run")
    finally:
        await loops.stop()
    assert peak == 3


async def test_discard_cancels_the_run_and_forgets_the_key() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work(_key: str) -> bool:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return True

    loops = engine(work)
    loops.ensure("a")
    loops.start()
    try:
        await started.wait()
        loops.discard("a")
        await asyncio.wait_for(cancelled.wait(), 5)
        assert "a" not in loops and loops.tracked() == []
    finally:
        await loops.stop()


async def test_an_exception_is_a_failure_and_the_loop_goes_on() -> None:
    runs = 0

    async def work(_key: str) -> bool:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("broken once")
        return True

    loops = engine(work, backoff=0.01)
    loops.ensure("a")
    loops.start()
    try:
        await until(lambda: runs >= 2, what="the run after the exception")
    finally:
        await loops.stop()


async def test_thousands_of_keys_cost_one_scheduler_task_not_one_task_each() -> None:
    async def work(_key: str) -> bool:
        return True

    loops = engine(work, interval=3600.0, concurrency=8)
    for i in range(5000):
        loops.ensure(f"k{i}")
    before = len(asyncio.all_tasks())
    loops.start()
    try:
        await until(lambda: loops.runs >= 5000, what="every key's first run", timeout=30)
        assert len(asyncio.all_tasks()) - before <= 1  # the scheduler; the runs have ended
    finally:
        await loops.stop()


async def test_jitter_spreads_the_interval_downwards() -> None:
    draws = iter([0.0, 1.0, 0.5])
    loops: KeyedLoops[str] = KeyedLoops(
        "jitter",
        lambda _k: asyncio.sleep(0, True),  # a run that returns True at once
        interval=10.0,
        backoff_initial=1.0,
        backoff_max=8.0,
        concurrency=1,
        jitter=0.1,
        rng=lambda: next(draws),
    )
    assert loops._next_delay("a", True, 0) == 10.0
    assert loops._next_delay("a", True, 0) == 9.0
    assert loops._next_delay("a", False, 3) == 4.0 * 0.95


@pytest.mark.uvloop  # the production loop, whose timers may fire up to a millisecond early
async def test_the_scheduler_does_not_spin_while_keys_wait() -> None:
    """A timer can fire a little before its time; the scheduler must not re-arm it in a tight loop."""

    async def work(_key: str) -> bool:
        return True

    loops = engine(work, interval=0.02, concurrency=4)
    for i in range(5):
        loops.ensure(f"k{i}")
    loops.start()
    try:
        await until(lambda: loops.runs >= 100, what="a hundred runs")
    finally:
        await loops.stop()
    assert loops.wakeups <= 4 * loops.runs, (loops.wakeups, loops.runs)


async def test_a_key_added_or_poked_runs_before_periodic_runs_that_fell_behind() -> None:
    """With every slot busy while periodic runs come due, a new key (a new APIService) and a
    poked one (a changed or suspected APIService) take the next free slots, ahead of the backlog."""
    order: list[str] = []
    gate = asyncio.Event()

    async def work(key: str) -> bool:
        order.append(key)
        if key == "busy":
            await gate.wait()
        return True

    loops = engine(work, interval=0.01, concurrency=1)
    for key in ("a", "b", "c", "poked"):
        loops.ensure(key)
    loops.start()
    try:
        await until(lambda: len(order) >= 4, what="the first runs")
        loops.ensure("busy")  # takes the only slot
        await until(lambda: order[-1] == "busy", what="the busy run")
        due = asyncio.get_running_loop().time() + 0.02
        await until(lambda: asyncio.get_running_loop().time() > due, what="the periodic runs falling behind")
        loops.ensure("new")
        loops.poke("poked")
        ran = len(order)
        gate.set()
        await until(lambda: len(order) >= ran + 2, what="the next two runs")
    finally:
        await loops.stop()
    assert order[ran : ran + 2] == ["new", "poked"]


async def test_a_run_of_a_tuple_key_is_named_after_its_loop_not_the_key() -> None:
    """An OpenAPI source's key holds its caBundle: writing it out as the task's name on every run
    cost kilobytes of `repr` per run (a few percent of an idle control process's CPU)."""
    names: list[str] = []

    async def work(_key: tuple[str, bytes]) -> bool:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())
        return True

    loops: KeyedLoops[tuple[str, bytes]] = KeyedLoops(
        "openapi", work, interval=60.0, backoff_initial=0.02, backoff_max=0.08, concurrency=2
    )
    named: KeyedLoops[str] = KeyedLoops(
        "discovery",
        lambda key: _named(key, names),
        interval=60.0,
        backoff_initial=0.02,
        backoff_max=0.08,
        concurrency=2,
    )
    loops.ensure(("bench/svc", b"-----BEGIN CERTIFICATE-----" * 100))
    named.ensure("v1.example.com")
    loops.start()
    named.start()
    try:
        await until(lambda: len(names) == 2, what="one run of each")
    finally:
        await loops.stop()
        await named.stop()
    assert sorted(names) == ["discovery:v1.example.com", "openapi:run"]


async def _named(_key: str, names: list[str]) -> bool:
    task = asyncio.current_task()
    assert task is not None
    names.append(task.get_name())
    return True


async def test_periodic_runs_of_every_engine_come_due_on_one_shared_tick() -> None:
    """Checks, discovery fetches and OpenAPI refreshes of 5000 APIServices, jittered apart, each
    woke the process for one request; due on shared ticks, those of a tick start together. A
    run asked for now is not held for a tick, and short waits (retries) are not aligned."""
    tick = 0.05
    loop = asyncio.get_running_loop()
    finished: dict[str, float] = {}

    async def work(key: str) -> bool:
        await asyncio.sleep(0)
        finished[key] = loop.time()
        return not key.startswith("failing")

    def engine_with_tick(name: str, interval: float, jitter: float) -> KeyedLoops[str]:
        draws = itertools.cycle([0.0, 0.3, 0.7, 0.9])
        return KeyedLoops(
            name, work, interval=interval, backoff_initial=0.02, backoff_max=0.02,
            concurrency=8, jitter=jitter, rng=lambda: next(draws), tick=tick,
        )  # fmt: skip

    checks, fetches = engine_with_tick("checks", 0.6, 0.1), engine_with_tick("fetches", 1.1, 0.0)
    checks.start()
    fetches.start()
    try:
        for i in range(4):  # added apart, as APIServices are
            checks.ensure(f"check{i}")
            fetches.ensure(f"fetch{i}")
            first = checks.due(f"check{i}")
            assert first is not None and first <= loop.time()  # asked for now: not held for a tick
            await until(functools.partial(set.issubset, {f"check{i}", f"fetch{i}"}, finished), what="first runs")
            await asyncio.sleep(0.013)
        checks.ensure("failing")
        await until(lambda: checks.failures("failing") >= 1, what="a failed run")
        keys = [(checks, f"check{i}") for i in range(4)] + [(fetches, f"fetch{i}") for i in range(4)]
        await until(lambda: all(engine.due(key) is not None for engine, key in keys), what="next runs due")
        for engine, key in keys:
            due = engine.due(key)
            assert due is not None
            assert abs(due / tick - round(due / tick)) < 1e-6, (key, due)  # on a tick of the loop's clock
            wait = due - finished[key]
            assert engine.interval * (1 - engine.jitter) - 1e-6 <= wait < engine.interval + tick, (key, wait)
        await until(lambda: checks.due("failing") is not None, what="the retry due")
        retry = checks.due("failing")
        assert retry is not None and abs(retry / tick - round(retry / tick)) > 1e-6  # 0.02 s: not aligned
    finally:
        await checks.stop()
        await fetches.stop()
