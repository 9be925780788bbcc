"""The folder watcher: changes come from inotify, polling as the fallback (latency: benchmarks/scale.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from aggregator.util.dirwatch import DirectoryWatcher
from aggregator.util.filewatch import stat_fingerprint
from tests.support.polling import until


def watcher(folder: Path, seen: list[float], **options: Any) -> DirectoryWatcher:
    return DirectoryWatcher(
        folder,
        lambda: stat_fingerprint(sorted(folder.iterdir())),
        lambda: seen.append(time.monotonic()),
        name="test",
        **options,
    )


async def kernel_watch_is_live(folder: Path, seen: list[float]) -> None:
    """Touch a probe file until the watcher reports it: the kernel watch is set up in a thread, so
    a fixed sleep would race it on a loaded machine. With the safety-net poll an hour away, a
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
