"""Local mode: APIService, Service and EndpointSlice manifests from a folder, reloaded on change.

Every `*.yaml`, `*.yml` and `*.json` under the folder is read (multi-document YAML and `kind: List`
included). The folder is watched through inotify (`util/dirwatch.py`), so edits land within milliseconds. A file that does not parse
is reported with its line and keeps contributing the objects it held before; an invalid object is
refused with upstream's validation message while its previous valid version (if any) stays, just as
kube-apiserver keeps the old object when an update is rejected. Fields are checked as `kubectl
apply` has kube-apiserver check them (strict: `unknown field "spec.versoin"` refuses the object);
a document of any other kind is skipped, and said once per file and kind. Each of these is kept
as a `ManifestProblem` (`problems()`), which `aggregator check`, `/readyz?verbose` and
`aggregator_manifest_errors` show (`problems.py`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from aggregator.model.apiservice import APIService
from aggregator.sources.folder import FileFingerprint, ManifestFolder, problems_by_file
from aggregator.sources.identity import with_system_fields
from aggregator.sources.manifests import Ignored, Rejected, flatten, to_object
from aggregator.sources.problems import READ_KINDS, REFUSED, SKIPPED, UNREADABLE, ManifestProblem
from aggregator.sources.store import Event, Key, Kind, Obj, Store, key_of, kind_of
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

ObjKey = tuple[Kind, Key]


# libyaml's parser when PyYAML was built with it (about 10x faster for thousands of manifests).
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# More changes than this in one reload are logged as a summary.
BULK_EVENTS = 20


K = TypeVar("K")
V = TypeVar("V")


def merge_by_file(
    files: Mapping[Path, Mapping[K, V]], what: str, kind_and_name: Callable[[K], tuple[str, str]]
) -> dict[K, V]:
    """Every file's objects in one map, the files in name order: an object defined in two files is
    the later file's, and the log says so (the RBAC and APF folders read their files this way)."""
    merged: dict[K, V] = {}
    owners: dict[K, Path] = {}
    for path in sorted(files):
        for key, obj in files[path].items():
            if key in owners:
                kind, name = kind_and_name(key)
                log.warning(
                    f"{what} object defined in two files; the later file wins",
                    extra=fields(kind=kind, name=name, first=str(owners[key]), wins=str(path)),
                )
            merged[key] = obj
            owners[key] = path
    return merged


class ParseError(ValueError):
    """A file that cannot be read, is not UTF-8, or is not valid YAML/JSON; the message starts with
    `path:line:` (or `path:` when there is no line), ready for the log and `ManifestProblem`."""


def read_documents(path: Path) -> list[Any]:
    """The file's documents; every reason it has none is a `ParseError`, so each reader of the
    folder handles one exception and words it the same way."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ParseError(f"{path}: {err}") from err
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


def log_not_loaded(logger: logging.Logger, what: str, path: Path, reason: str, kept: int) -> None:
    """A file of the folder that does not parse: the objects it held before stay in force, as
    kube-apiserver keeps an object whose update it refuses. Each reader of the folder logs it on its
    own logger (`what` names its kind of manifest), in the same words."""
    logger.error(
        f"{what} file not loaded; the objects it held before stay in force",
        extra=fields(file=str(path), reason=reason, kept=kept),
    )


# What a folder APIService's `raw` keeps of its manifest. The served object is encoded from the
# decoded fields (`apiregistration/documents.py`), the status lives in `conditions`, and only the
# metadata is ever read back (labels, annotations, uid, creationTimestamp): the spec's dicts cost
# about 600 bytes an APIService in every process, for nothing.
_KEPT_OF_MANIFEST = frozenset({"apiVersion", "kind", "metadata"})


def _fields_hold_spec(svc: APIService) -> APIService:
    raw = svc.raw
    if raw.keys() <= _KEPT_OF_MANIFEST:
        return svc
    return replace(svc, raw={key: value for key, value in raw.items() if key in _KEPT_OF_MANIFEST})


@dataclass
class _FileState:
    fingerprint: FileFingerprint
    objects: dict[ObjKey, Obj] = field(default_factory=dict)
    problems: tuple[ManifestProblem, ...] = ()


class FolderSource:
    """Keeps the store equal to the valid objects in `directory`."""

    def __init__(
        self,
        directory: str | Path,
        store: Store,
        *,
        interval: float = 1.0,
        use_inotify: bool = True,
        read_elsewhere: Callable[[Mapping[str, Any]], bool] = lambda _doc: False,
    ) -> None:
        self.directory = Path(directory)
        self.store = store
        # Documents of the folder another component reads (local mode's RBAC): not "skipped".
        self.read_elsewhere = read_elsewhere
        self._files: dict[Path, _FileState] = {}
        # Which files define each object: nearly always one (a tuple of one is a quarter of a set's
        # memory, and the control holds an entry per object of the folder).
        self._owners: dict[ObjKey, tuple[Path, ...]] = {}
        self._reported: set[tuple[Path, str, str]] = set()  # (file, apiVersion, kind) skipped and said
        # Only the files with problems, so that reading them costs what is wrong, not the folder.
        self._problems: dict[Path, tuple[ManifestProblem, ...]] = {}
        self._folder = ManifestFolder(
            self.directory, self.reload, name="apiservices-dir", interval=interval, use_inotify=use_inotify
        )

    def problems(self) -> list[ManifestProblem]:
        """What the folder holds that is not loaded now, file by file (`problems.py`)."""
        return problems_by_file(self._problems)

    async def start(self) -> None:
        self.reload()
        self.store.mark_synced()
        self._folder.start()

    async def stop(self) -> None:
        await self._folder.stop()

    def reload(self) -> None:
        """Re-read changed files and apply their differences to the store.

        Only the objects of files that changed are compared: one edit in a folder of thousands of
        APIServices costs what that file holds, not what the folder holds.
        """
        changes = self._folder.changes(self._files)
        affected: set[ObjKey] = set()
        for path in changes.removed:
            log.info("manifest file removed", extra=fields(file=str(path)))
            self._reported = {seen for seen in self._reported if seen[0] != path}
            self._problems.pop(path, None)
            affected |= self._forget_file(path)
        for change in changes.changed:
            path, state = change.path, change.previous
            new = self._read(path, change.fingerprint, state)
            if state is not None:
                affected |= self._forget_file(path)
            self._files[path] = new
            if new.problems:
                self._problems[path] = new.problems
            else:
                self._problems.pop(path, None)
            for obj_key in new.objects:
                owners = self._owners.get(obj_key, ())
                if path not in owners:
                    self._owners[obj_key] = (*owners, path)
            affected |= set(new.objects)
        self._apply(affected)

    def _forget_file(self, path: Path) -> set[ObjKey]:
        state = self._files.pop(path)
        for obj_key in state.objects:
            remaining = tuple(owner for owner in self._owners.get(obj_key, ()) if owner != path)
            if remaining:
                self._owners[obj_key] = remaining
            else:
                self._owners.pop(obj_key, None)
        return set(state.objects)

    def _read(self, path: Path, fingerprint: FileFingerprint, previous: _FileState | None) -> _FileState:
        kept = dict(previous.objects) if previous else {}
        try:
            docs = read_documents(path)
        except ParseError as err:
            log_not_loaded(log, "manifest", path, str(err), len(kept))
            return _FileState(fingerprint, kept, (ManifestProblem(path, UNREADABLE, str(err), len(kept)),))
        objects: dict[ObjKey, Obj] = {}
        problems: list[ManifestProblem] = []
        for index, doc in enumerate(d for raw in docs for d in flatten(raw)):
            result = to_object(doc)
            if result is None:
                continue
            if isinstance(result, Ignored):
                if not self.read_elsewhere(doc):
                    self._skipped(path, result)
                    problems.append(ManifestProblem(path, SKIPPED, f"{result.api_version} {result.kind}"))
                continue
            if isinstance(result, Rejected):
                name = (doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None
                previous_obj = next(
                    (o for k, o in kept.items() if k[1][1] == name and k[0].value == doc.get("kind")), None
                )
                log.error(
                    result.message,
                    extra=fields(
                        file=str(path),
                        document=index,
                        name=name or "",
                        kept_previous=previous_obj is not None,
                    ),
                )
                if previous_obj is not None:
                    objects[(kind_of(previous_obj), key_of(previous_obj))] = previous_obj
                problems.append(ManifestProblem(path, REFUSED, result.message, int(previous_obj is not None)))
                continue
            if isinstance(result, APIService):
                result = _fields_hold_spec(result)
            objects[(kind_of(result), key_of(result))] = result
        return _FileState(fingerprint, objects, tuple(problems))

    def _skipped(self, path: Path, ignored: Ignored) -> None:
        """A document of a kind the gateway does not read: said once per file and kind, so a
        `kind: Deployment` left in the folder is noticed without a line at every reload."""
        seen = (path, ignored.api_version, ignored.kind)
        if seen in self._reported:
            return
        self._reported.add(seen)
        log.warning(
            "manifest skipped: the gateway reads only %s",
            READ_KINDS,
            extra=fields(file=str(path), apiVersion=ignored.api_version, kind=ignored.kind),
        )

    def _apply(self, affected: set[ObjKey]) -> None:
        events: list[Event] = []
        for obj_key in sorted(affected, key=lambda k: (k[0].value, k[1])):
            kind, key = obj_key
            owners = sorted(self._owners.get(obj_key, ()))
            if not owners:
                event = self.store.delete(kind, *key)
            else:
                if len(owners) > 1:
                    log.warning(
                        "object defined in two files; the later file wins",
                        extra=fields(
                            kind=kind.value, name=key[1], first=str(owners[0]), wins=str(owners[-1])
                        ),
                    )
                obj = self._files[owners[-1]].objects[obj_key]
                if isinstance(obj, APIService):
                    # uid and creationTimestamp as kube-apiserver sets them: once, here (`identity.py`)
                    obj = with_system_fields(obj, self.store.apiservice(obj.name))
                event = self.store.upsert(obj, preserve_status=True)
            if event is not None:
                events.append(event)
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
