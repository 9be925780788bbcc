"""A TTL cache in front of an expensive async lookup, with identical concurrent lookups coalesced.

TokenReview and SubjectAccessReview answers are cached so that a busy client costs kube-apiserver
nothing after its first request. The lookup is split so the request path can stay free of awaits
on a hit: `get(key)` is a plain dictionary lookup, and only a miss calls `await fetch(key, lookup)`.
While a lookup for a key is in flight, later callers for the same key wait for that one call
(singleflight) instead of starting their own. The call runs as its own task: a caller that gives
up (client disconnected) does not cancel it for the others. Failures are never cached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from cachetools import TLRUCache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MISSING = object()


class CoalescingCache(Generic[K, V]):
    """`get` (sync) then `fetch` (async) on a miss.

    `ttl_for(value)` says how long an answer stays (0 = do not cache it); `cacheable(key)` can refuse
    keys outright (upstream refuses oversized authorization requests).
    """

    def __init__(
        self,
        *,
        ttl_for: Callable[[V], float],
        maxsize: int,
        cacheable: Callable[[K], bool] = lambda _key: True,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_for = ttl_for
        self._cacheable = cacheable
        self._cache: TLRUCache[K, V] = TLRUCache(
            maxsize=maxsize, ttu=lambda _k, value, now: now + self._ttl_for(value), timer=timer
        )
        self._inflight: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def keys(self) -> list[K]:
        """The cached keys (for inspection: they are digests where the lookup involves a secret)."""
        return list(self._cache.keys())

    def get(self, key: K) -> V | object:
        """The cached answer, or `MISSING`. Never awaits, never does I/O."""
        return self._cache.get(key, MISSING)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def fetch(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        """Run `lookup()` for `key` (or join the one already running for it) and cache a success.

        The key may be a digest of a secret: `lookup` carries the secret, the cache never sees it.
        """
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(self._fill(key, lookup))
            future.add_done_callback(_consume_exception)
            self._inflight[key] = future
        return await asyncio.shield(future)

    async def _fill(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await lookup()
            if self._cacheable(key) and self._ttl_for(value) > 0:
                self._cache[key] = value
            return value
        finally:
            self._inflight.pop(key, None)

    def clear(self) -> None:
        self._cache.clear()


def _consume_exception(future: asyncio.Future[Any]) -> None:
    """Waiters may all have gone; mark the failure as seen so asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()
