"""The folder watcher: a change is handled within milliseconds (inotify), polling as the fallback."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from aggregator.util.dirwatch import DirectoryWatcher
from aggregator.util.filewatch import stat_fingerprint
from tests.support.polling import until


def watcher(folder: Path, seen: list[float], **options: object) -> DirectoryWatcher:
    return DirectoryWatcher(
        folder,
        lambda: stat_fingerprint(sorted(folder.iterdir())),
        lambda: seen.append(time.monotonic()),
        name="test",
        **options,  # type: ignore[arg-type]
    )


async def test_a_new_file_is_seen_within_100_ms(tmp_path: Path) -> None:
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=5.0)
    watch.start()
    try:
        await asyncio.sleep(0.2)  # the kernel watch is set up
        assert watch.inotify
        written = time.monotonic()
        (tmp_path / "a.yaml").write_text("kind: APIService\n")
        await until(lambda: seen, what="the change", timeout=5)
        assert seen[0] - written < 0.1
    finally:
        await watch.stop()


async def test_a_configmap_style_symlink_swap_is_seen(tmp_path: Path) -> None:
    first, second = tmp_path / "..2026_01", tmp_path / "..2026_02"
    first.mkdir()
    (first / "a.yaml").write_text("one\n")
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "a.yaml").symlink_to("..data/a.yaml")
    seen: list[float] = []
    watch = watcher(tmp_path, seen, interval=5.0)
    watch.start()
    try:
        await asyncio.sleep(0.2)
        second.mkdir()
        (second / "a.yaml").write_text("two\n")
        (tmp_path / "..data_tmp").symlink_to(second.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # what kubelet does
        await until(lambda: seen, what="the swap", timeout=5)
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
