"""Local mode: APIService, Service and EndpointSlice manifests from a folder, reloaded on change.

Every `*.yaml`, `*.yml` and `*.json` under the folder is read (multi-document YAML and `kind: List`
included). The folder is polled once a second, so edits land within 2 s. A file that does not parse
is reported with its line and keeps contributing the objects it held before; an invalid object is
refused with upstream's validation message while its previous valid version (if any) stays, just as
kube-apiserver keeps the old object when an update is rejected.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aggregator.sources.manifests import Ignored, Rejected, flatten, to_object
from aggregator.sources.store import Key, Kind, Obj, Store, key_of, kind_of
from aggregator.util.dirwatch import DirectoryWatcher
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
ObjKey = tuple[Kind, Key]


# libyaml's parser when PyYAML was built with it (about 10x faster for thousands of manifests).
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# More changes than this in one reload are logged as a summary.
BULK_EVENTS = 20


class ParseError(ValueError):
    """A file that is not valid YAML/JSON; the message starts with `path:line:`."""


def read_documents(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            return [json.loads(text)] if text.strip() else []
        except json.JSONDecodeError as err:
            raise ParseError(f"{path}:{err.lineno}: {err.msg}") from err
    try:
        return list(yaml.load_all(text, Loader=_YAML_LOADER))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise ParseError(f"{path}:{line}: {err.problem or err.context or 'invalid YAML'}") from err
    except yaml.YAMLError as err:
        raise ParseError(f"{path}: {err}") from err


@dataclass
class _FileState:
    fingerprint: tuple[int, int, int]
    objects: dict[ObjKey, Obj] = field(default_factory=dict)
    error: str | None = None


def _manifest_files(directory: Path) -> dict[Path, tuple[int, int, int]]:
    found: dict[Path, tuple[int, int, int]] = {}
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


class FolderSource:
    """Keeps the store equal to the valid objects in `directory`."""

    def __init__(
        self, directory: str | Path, store: Store, *, interval: float = 1.0, use_inotify: bool = True
    ) -> None:
        self.directory = Path(directory)
        self.store = store
        self._files: dict[Path, _FileState] = {}
        self._watcher = DirectoryWatcher(
            self.directory,
            lambda: tuple(sorted(_manifest_files(self.directory).items())),
            self.reload,
            interval=interval,
            name="apiservices-dir",
            use_inotify=use_inotify,
        )

    @property
    def errors(self) -> dict[Path, str]:
        """Files currently failing to parse, with the reason."""
        return {p: s.error for p, s in self._files.items() if s.error}

    async def start(self) -> None:
        self.reload()
        self.store.mark_synced()
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()

    def reload(self) -> None:
        """Re-read changed files and apply the differences to the store."""
        current = _manifest_files(self.directory)
        for path in set(self._files) - set(current):
            log.info("manifest file removed", extra=fields(file=str(path)))
            del self._files[path]
        for path, fingerprint in current.items():
            state = self._files.get(path)
            if state is None or state.fingerprint != fingerprint:
                self._files[path] = self._read(path, fingerprint, state)
        self._apply()

    def _read(self, path: Path, fingerprint: tuple[int, int, int], previous: _FileState | None) -> _FileState:
        kept = dict(previous.objects) if previous else {}
        try:
            docs = read_documents(path)
        except (ParseError, OSError, UnicodeDecodeError) as err:
            reason = str(err) if isinstance(err, ParseError) else f"{path}: {err}"
            log.error(
                "manifest file not loaded; keeping the objects it held before",
                extra=fields(file=str(path), reason=reason, kept=len(kept)),
            )
            return _FileState(fingerprint, kept, reason)
        objects: dict[ObjKey, Obj] = {}
        for index, doc in enumerate(d for raw in docs for d in flatten(raw)):
            result = to_object(doc)
            if result is None:
                continue
            if isinstance(result, Ignored):
                log.debug(
                    "ignoring manifest of another kind",
                    extra=fields(file=str(path), apiVersion=result.api_version, kind=result.kind),
                )
                continue
            if isinstance(result, Rejected):
                name = (doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None
                previous_obj = next(
                    (o for k, o in kept.items() if k[1][1] == name and k[0].value == doc.get("kind")), None
                )
                log.error(
                    result.message,
                    extra=fields(file=str(path), document=index, kept_previous=previous_obj is not None),
                )
                if previous_obj is not None:
                    objects[(kind_of(previous_obj), key_of(previous_obj))] = previous_obj
                continue
            objects[(kind_of(result), key_of(result))] = result
        return _FileState(fingerprint, objects)

    def _apply(self) -> None:
        desired: dict[Kind, dict[Key, Obj]] = {kind: {} for kind in Kind}
        owner: dict[ObjKey, Path] = {}
        for path in sorted(self._files):
            for obj_key, obj in self._files[path].objects.items():
                if obj_key in owner:
                    log.warning(
                        "object defined in two files; the later file wins",
                        extra=fields(
                            kind=obj_key[0].value,
                            name=obj_key[1][1],
                            first=str(owner[obj_key]),
                            wins=str(path),
                        ),
                    )
                owner[obj_key] = path
                desired[obj_key[0]][obj_key[1]] = obj
        events = [
            event
            for kind, objs in desired.items()
            for event in self.store.replace_all(kind, objs.values(), preserve_status=True)
        ]
        # One line per object for an edit; a summary (and debug lines) when a folder of thousands loads.
        each = log.info if len(events) <= BULK_EVENTS else log.debug
        for event in events:
            each(
                "object %s",
                event.type.lower(),
                extra=fields(kind=event.kind.value, name=event.obj.name, revision=event.revision),
            )
        if len(events) > BULK_EVENTS:
            counts = Counter(f"{e.kind.value} {e.type.lower()}" for e in events)
            log.info(
                "objects changed", extra=fields(**{k.replace(" ", "_"): n for k, n in sorted(counts.items())})
            )
