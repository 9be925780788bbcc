"""The folder watcher: changes come from inotify, polling as the fallback (latency: benchmarks/scale.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.util.dirwatch import DirectoryWatcher
from aggregator.util.filewatch import Fingerprint, stat_fingerprint
from tests.support.polling import until


def watcher(folder: Path, seen: list[float], reads: list[int] | None = None, **options: Any) -> DirectoryWatcher:
    """`reads` counts the looks at the folder's fingerprint (what a poll costs)."""

    def fingerprint() -> Fingerprint:
        if reads is not None:
            reads.append(1)
        return stat_fingerprint(sorted(folder.iterdir())) if folder.is_dir() else ("missing",)

    return DirectoryWatcher(
        folder,
        fingerprint,
        lambda: seen.append(time.monotonic()),
        name="test",
        **options,
    )


async def kernel_watch_is_live(folder: Path, seen: list[float]) -> None:
    """Touch a probe file until the watcher reports it: the kernel watch is set up in a thread, so
    a fixed sleep would race it on a loaded machine. With the fallback poll an hour away, a
    report can only come from inotify."""
    probe = folder / ".probe"
    for attempt in range(100):
        probe.write_text(str(attempt))
        try:
            await until(lambda: seen, what="the probe", timeout=0.2)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("the watcher never reported the probe file")
    seen.clear()


async def test_a_new_file_is_reported_by_the_kernel_not_the_poll(tmp_path: Path) -> None:
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=3600.0)
    watch.start()
    try:
        await kernel_watch_is_live(tmp_path, seen)
        assert watch.inotify
        (tmp_path / "a.yaml").write_text("kind: APIService\n")
        await until(lambda: seen, what="the change")
    finally:
        await watch.stop()


async def test_a_configmap_style_symlink_swap_is_seen(tmp_path: Path) -> None:
    first, second = tmp_path / "..2026_01", tmp_path / "..2026_02"
    first.mkdir()
    (first / "a.yaml").write_text("one\n")
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "a.yaml").symlink_to("..data/a.yaml")
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=3600.0)
    watch.start()
    try:
        await kernel_watch_is_live(tmp_path, seen)
        second.mkdir()
        (second / "a.yaml").write_text("two\n")
        (tmp_path / "..data_tmp").symlink_to(second.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # what kubelet does
        await until(lambda: seen, what="the swap")
    finally:
        await watch.stop()


async def test_without_inotify_the_folder_is_polled(tmp_path: Path) -> None:
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=0.1, use_inotify=False)
    watch.start()
    try:
        (tmp_path / "a.yaml").write_text("x\n")
        await until(lambda: seen, what="the polled change", timeout=5)
        assert not watch.inotify
    finally:
        await watch.stop()


async def written_and_reported(path: Path, seen: list[float]) -> None:
    count = len(seen)
    path.write_text("kind: APIService\n")
    await until(lambda: len(seen) > count, what=f"{path.name} reported")


async def test_with_inotify_the_folder_is_never_polled(tmp_path: Path) -> None:
    """Nothing reads the folder while nothing changes, and a change costs the caller's own read only:
    a folder of thousands of manifests is not walked on a timer (nor twice per change)."""
    seen: list[float] = []
    reads: list[int] = []
    watch = watcher(tmp_path, seen, reads, interval=0.05)
    watch.start()
    try:
        await kernel_watch_is_live(tmp_path, seen)
        before = len(reads)
        for name in ("a.yaml", "b.yaml", "c.yaml"):
            await written_and_reported(tmp_path / name, seen)
        await asyncio.sleep(20 * 0.05)  # twenty fallback intervals: no poll runs beside inotify
        assert len(reads) == before
        assert not watch.polling
    finally:
        await watch.stop()


async def test_a_change_before_the_kernel_watch_is_set_up_is_not_lost(tmp_path: Path) -> None:
    """The caller read the folder, then started the watcher: a file written before the kernel's
    watch exists is found by one look at the folder once the watch is up."""
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=3600.0)
    watch.start()
    try:
        (tmp_path / "early.yaml").write_text("kind: APIService\n")  # before the watch task ran
        await until(lambda: seen, what="the early file", timeout=15)
        assert watch.inotify
    finally:
        await watch.stop()


async def test_a_removed_folder_is_polled_from_then_on_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kernel's watch goes with the folder: the watcher says so once and polls, so the folder
    made again (`rm -rf` and a new checkout) is still followed."""
    folder = tmp_path / "manifests"
    folder.mkdir()
    seen: list[float] = []
    watch = watcher(folder, seen, interval=0.05)
    watch.start()
    try:
        await kernel_watch_is_live(folder, seen)
        with caplog.at_level(logging.WARNING, logger="aggregator.util.dirwatch"):
            shutil.rmtree(folder)
            await until(lambda: not watch.inotify, what="the kernel watch to end")
            folder.mkdir()
            seen.clear()
            (folder / "a.yaml").write_text("kind: APIService\n")
            await until(lambda: seen, what="the new folder's file, polled")
            count = len(seen)
            (folder / "b.yaml").write_text("kind: APIService\n")
            await until(lambda: len(seen) > count, what="a second polled change")
        warnings = [r for r in caplog.records if "polling it instead" in r.getMessage()]
        assert len(warnings) == 1 and watch.polling
    finally:
        await watch.stop()
