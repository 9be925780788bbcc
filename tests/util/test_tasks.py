"""Supervised tasks: kept until they end, a crash logged with the task's name, cancelled on close."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aggregator.util.tasks import TaskSet
from tests.support.logrecords import fields_of
from tests.support.polling import until


async def test_a_crash_is_logged_with_the_task_name(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("owner")

    async def boom() -> None:
        raise RuntimeError("broken on purpose")

    tasks.spawn(boom(), name="worker")
    await until(lambda: len(tasks) == 0, what="the task to end")
    records = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(records) == 1
    assert fields_of(records[0]) == {"task": "owner:worker"}
    assert records[0].exc_info is not None and "broken on purpose" in str(records[0].exc_info[1])


async def test_close_cancels_what_is_still_running(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("owner")
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = tasks.spawn(forever(), name="forever")
    await started.wait()
    assert len(tasks) == 1
    await tasks.close()
    assert task.cancelled() and len(tasks) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a cancellation is not a crash


async def test_a_finished_task_is_released() -> None:
    tasks = TaskSet("owner")

    async def quick() -> int:
        return 7

    task = tasks.spawn(quick(), name="quick")
    assert await task == 7
    await until(lambda: len(tasks) == 0, what="the task to be released")
