"""Wait for a condition instead of racing a background task: the one polling helper of the suite."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def until(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *, every: float = 0.01
) -> float:
    """Return (the seconds it took) once `predicate()` is truthy; fail after `timeout` seconds.

    The default timeout is generous on purpose: it only matters when the test is failing anyway,
    and a loaded 2-core CI machine can be slow to schedule a background task.
    """
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(every)
    return time.monotonic() - started


async def until_async(
    predicate: Callable[[], Awaitable[Any]],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    every: float = 0.05,
) -> float:
    """`until` for a predicate that must await (a request): awaited until truthy, or fail."""
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(every)
    return time.monotonic() - started
