"""Local mode's folder as its readers see it: the manifest files in it, watched, and which of them
changed since a reader last looked.

Three components read `--apiservices-dir` (the folder source: APIServices, Services and
EndpointSlices; the RBAC folder; the APF folder). Each keeps its own per-file state, so each asks
`changes` with what it holds and re-reads only the files that went or moved, and a folder of
thousands of manifests costs an edit what that file holds. Before this module each of them wrote
the watcher, the walk and the comparison again.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from aggregator.util.dirwatch import DirectoryWatcher

SUFFIXES = (".yaml", ".yml", ".json")

# (inode, size, mtime in ns): a file whose fingerprint moved is read again.
FileFingerprint = tuple[int, int, int]


class FileState(Protocol):
    """What a reader kept of one file: at least the fingerprint it was read at."""

    @property
    def fingerprint(self) -> FileFingerprint: ...


S = TypeVar("S", bound=FileState)
P = TypeVar("P")


def manifest_files(directory: Path) -> dict[Path, FileFingerprint]:
    """Every manifest file under `directory` (hidden entries skipped) with its (inode, size, mtime)."""
    found: dict[Path, FileFingerprint] = {}
    for root, dirs, files in os.walk(directory, followlinks=True):
        # Skip hidden entries, which includes Kubernetes volume internals (`..data`, `..2026_...`).
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.endswith(SUFFIXES):
                continue
            path = Path(root) / name
            try:
                st = path.stat()
            except OSError:
                continue
            found[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


@dataclass(frozen=True, slots=True)
class Changed(Generic[S]):
    """A file that is new (`previous` None) or whose fingerprint moved since the reader read it."""

    path: Path
    fingerprint: FileFingerprint
    previous: S | None


@dataclass(frozen=True, slots=True)
class FolderChanges(Generic[S]):
    removed: list[Path]
    changed: list[Changed[S]]


class ManifestFolder:
    """One reader's watch on the folder: `on_change` runs (on the event loop) after the files move."""

    def __init__(
        self,
        directory: Path,
        on_change: Callable[[], None],
        *,
        name: str,
        interval: float = 1.0,
        use_inotify: bool = True,
    ) -> None:
        self.directory = directory
        self._watcher = DirectoryWatcher(
            directory,
            lambda: tuple(sorted(manifest_files(directory).items())),
            on_change,
            interval=interval,
            name=name,
            use_inotify=use_inotify,
        )

    def start(self) -> None:
        """Watch from now on; the reader has read the folder once (`changes` with nothing held)."""
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()

    def changes(self, held: Mapping[Path, S]) -> FolderChanges[S]:
        """The files gone since the reader read them, and the new or moved ones, in path order."""
        current = manifest_files(self.directory)
        removed = [path for path in held if path not in current]
        changed: list[Changed[S]] = []
        for path, fingerprint in current.items():
            previous = held.get(path)
            if previous is None or previous.fingerprint != fingerprint:
                changed.append(Changed(path, fingerprint, previous))
        return FolderChanges(removed, changed)


class FolderReader(ABC, Generic[S]):
    """A reader of one kind of manifest in the folder (local mode's RBAC, APF): what it read per file,
    a file read again only when it moved, and one `_publish` per reload that changed what counts."""

    def __init__(self, directory: str | Path, *, name: str, interval: float, use_inotify: bool) -> None:
        self.directory = Path(directory)
        self._files: dict[Path, S] = {}
        self._folder = ManifestFolder(
            self.directory, self.reload, name=name, interval=interval, use_inotify=use_inotify
        )

    async def start(self) -> None:
        """Read the folder and publish (even when it holds nothing of this kind), then follow it."""
        self.reload(initial=True)
        self._folder.start()

    async def stop(self) -> None:
        await self._folder.stop()

    def reload(self, *, initial: bool = False) -> None:
        """Re-read the files that changed; publish if a file that counts went, came or changed."""
        changes = self._folder.changes(self._files)
        changed = initial
        for path in changes.removed:
            changed |= self._counts(self._files.pop(path))
            self._noted(path, None)
        for change in changes.changed:
            new = self._read(change.path, change.fingerprint, change.previous)
            self._files[change.path] = new
            self._noted(change.path, new)
            changed |= self._counts(new) or (change.previous is not None and self._counts(change.previous))
        if changed:
            self._publish()

    @abstractmethod
    def _read(self, path: Path, fingerprint: FileFingerprint, previous: S | None) -> S:
        """The file's state now; `previous` is what it held before (kept when it no longer parses)."""

    @abstractmethod
    def _counts(self, state: S) -> bool:
        """Whether the file holds something of this kind: only such files' changes are published."""

    @abstractmethod
    def _publish(self) -> None:
        """Make what the files hold now current."""

    def _noted(self, path: Path, state: S | None) -> None:
        """A file was read again (`state`) or went (None); for readers that index their files."""


def problems_by_file(problems: Mapping[Path, Sequence[P]]) -> list[P]:
    """Every file's problems in one list, the files in name order (what `problems()` returns)."""
    return [problem for path in sorted(problems) for problem in problems[path]]
