"""CoalescingCache: one lookup per key in flight, answers kept for their TTL, failures never kept."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from aggregator.auth.cache import MISSING, CoalescingCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Counts lookups; each waits for `gate` so callers provably overlap."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def lookup(self, value: str) -> str:
        self.calls += 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return value


def cache_for(clock: Clock, *, ttl: float = 10.0, **kwargs: Any) -> CoalescingCache[str, str]:
    return CoalescingCache(ttl_for=lambda _v: ttl, maxsize=16, timer=clock, **kwargs)


async def test_identical_concurrent_lookups_share_one_call() -> None:
    clock, backend = Clock(), Backend()
    cache = cache_for(clock)
    waiters = [asyncio.create_task(cache.fetch("k", lambda: backend.lookup("v"))) for _ in range(100)]
    await asyncio.sleep(0)  # one loop turn: every task has started its fetch and now waits on the gate
    assert cache.inflight == 1
    backend.gate.set()
    assert await asyncio.gather(*waiters) == ["v"] * 100
    assert backend.calls == 1
    assert cache.get("k") == "v"
    assert cache.inflight == 0


async def test_different_keys_do_not_share() -> None:
    clock, backend = Clock(), Backend()
    backend.gate.set()
    cache = cache_for(clock)
    got = await asyncio.gather(*(cache.fetch(k, functools.partial(backend.lookup, k)) for k in "abcab"))
    assert got == list("abcab")
    assert backend.calls == 3


async def test_answers_expire_after_their_ttl() -> None:
    clock, backend = Clock(), Backend()
    backend.gate.set()
    cache = cache_for(clock, ttl=10.0)
    await cache.fetch("k", lambda: backend.lookup("v"))
    clock.now += 9.9
    assert cache.get("k") == "v"
    clock.now += 0.2
    assert cache.get("k") is MISSING


async def test_per_answer_ttl() -> None:
    clock, backend = Clock(), Backend()
    backend.gate.set()
    cache: CoalescingCache[str, str] = CoalescingCache(
        ttl_for=lambda v: 10.0 if v == "allowed" else 2.0, maxsize=16, timer=clock
    )
    await cache.fetch("a", lambda: backend.lookup("allowed"))
    await cache.fetch("d", lambda: backend.lookup("denied"))
    clock.now += 3
    assert cache.get("a") == "allowed"
    assert cache.get("d") is MISSING


async def test_failures_reach_every_waiter_and_are_not_cached() -> None:
    clock, backend = Clock(), Backend()
    cache = cache_for(clock)
    backend.fail = RuntimeError("kube-apiserver down")
    waiters = [asyncio.create_task(cache.fetch("k", lambda: backend.lookup("v"))) for _ in range(50)]
    await asyncio.sleep(0)  # one loop turn: every task has started its fetch and now waits on the gate
    backend.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert backend.calls == 1
    assert cache.get("k") is MISSING
    backend.fail = None
    assert await cache.fetch("k", lambda: backend.lookup("v")) == "v"
    assert backend.calls == 2


async def test_a_cancelled_waiter_does_not_cancel_the_shared_lookup() -> None:
    clock, backend = Clock(), Backend()
    cache = cache_for(clock)
    first = asyncio.create_task(cache.fetch("k", lambda: backend.lookup("v")))
    second = asyncio.create_task(cache.fetch("k", lambda: backend.lookup("v")))
    await asyncio.sleep(0)  # one loop turn: both tasks have joined the one lookup
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    backend.gate.set()
    assert await second == "v"
    assert backend.calls == 1
    assert cache.get("k") == "v"


async def test_zero_ttl_and_uncacheable_keys_are_not_kept() -> None:
    clock, backend = Clock(), Backend()
    backend.gate.set()
    no_ttl = cache_for(clock, ttl=0.0)
    await no_ttl.fetch("k", lambda: backend.lookup("v"))
    assert no_ttl.get("k") is MISSING
    refusing = cache_for(clock, cacheable=lambda key: key != "huge")
    await refusing.fetch("huge", lambda: backend.lookup("v"))
    await refusing.fetch("small", lambda: backend.lookup("v"))
    assert refusing.get("huge") is MISSING
    assert refusing.get("small") == "v"


async def test_size_is_bounded() -> None:
    clock, backend = Clock(), Backend()
    backend.gate.set()
    cache = cache_for(clock)
    for i in range(40):
        await cache.fetch(str(i), functools.partial(backend.lookup, str(i)))
    assert len(cache) == 16
