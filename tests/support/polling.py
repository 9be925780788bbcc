"""Wait for a condition instead of racing a background task: the polling helpers of the suite.

`until` and `until_async` for event-loop tests, `until_blocking` for tests that drive subprocesses
from plain (non-async) code. `what` names the condition in the failure; a callable is asked only
then (for output that says what was seen instead).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

What = str | Callable[[], str]


def _timed_out(timeout: float, what: What) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout:g}s waiting for {said}")


async def until(
    predicate: Callable[[], Any], timeout: float = 10.0, what: What = "condition", *, every: float = 0.01
) -> float:
    """Return (the seconds it took) once `predicate()` is truthy; fail after `timeout` seconds.

    The default timeout is generous on purpose: it only matters when the test is failing anyway,
    and a loaded 2-core CI machine can be slow to schedule a background task.
    """
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise _timed_out(timeout, what)
        await asyncio.sleep(every)
    return time.monotonic() - started


async def until_async(
    predicate: Callable[[], Awaitable[Any]],
    timeout: float = 10.0,
    what: What = "condition",
    *,
    every: float = 0.05,
) -> float:
    """`until` for a predicate that must await (a request): awaited until truthy, or fail."""
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise _timed_out(timeout, what)
        await asyncio.sleep(every)
    return time.monotonic() - started


def until_blocking(
    predicate: Callable[[], Any], timeout: float = 10.0, what: What = "condition", *, every: float = 0.05
) -> float:
    """`until` for plain code (a subprocess's output, a port): blocks the thread between checks."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise _timed_out(timeout, what)
        time.sleep(every)
    return time.monotonic() - started
