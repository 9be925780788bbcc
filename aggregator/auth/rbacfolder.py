"""Local mode's RBAC: the Role, ClusterRole, RoleBinding and ClusterRoleBinding manifests of
`--apiservices-dir`, reloaded like the rest of the folder.

The folder source (`sources/files.py`) keeps APIServices, Services and EndpointSlices; this
component reads the same folder for the `rbac.authorization.k8s.io` kinds, and only files that
mention that group are parsed, so a folder of thousands of APIServices costs a text scan. Each
change compiles a new `RBACPolicy` (`rbacobjects.compile_policy`) that the authorizer reads.

Bad input never loosens authorization. A file that does not parse keeps the RBAC objects it held
before (the error names the file and line); an invalid object is refused with kube-apiserver's
message (naming the file, the document and the field) and its previous version stays in force.
A file that does not parse but mentions the group counts as holding RBAC manifests even the
first time it is read, so a broken RBAC file never lets local mode fall back to allowing every
authenticated caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggregator.auth.rbac import GROUP, RBACPolicy
from aggregator.auth.rbacobjects import (
    ObjectKey,
    RBACObject,
    Refused,
    compile_policy,
    decode,
    is_rbac,
    key_of,
)
from aggregator.sources.files import ParseError, log_not_loaded, merge_by_file, read_documents
from aggregator.sources.folder import FileFingerprint, FolderReader, problems_by_file
from aggregator.sources.manifests import flatten
from aggregator.sources.problems import REFUSED, ManifestProblem
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

Listener = Callable[[RBACPolicy, RBACPolicy], None]  # (new, previous)


@dataclass
class _FileState:
    fingerprint: FileFingerprint
    objects: dict[ObjectKey, RBACObject] = field(default_factory=dict)
    # The file holds RBAC manifests (valid or not), or fails to parse and mentions the group.
    holds_rbac: bool = False
    # Objects refused (a file that does not parse is the folder source's problem to report).
    problems: tuple[ManifestProblem, ...] = ()


def _doc_key(doc: Mapping[str, Any]) -> ObjectKey:
    """The key a refused document would have had (to find its previous valid version)."""
    metadata = doc.get("metadata")
    meta = metadata if isinstance(metadata, Mapping) else {}
    kind = str(doc.get("kind"))
    namespace = str(meta.get("namespace") or "default") if kind in ("Role", "RoleBinding") else ""
    return (kind, namespace, str(meta.get("name") or ""))


class RBACFolder(FolderReader[_FileState]):
    """Keeps `current` equal to the valid RBAC objects in `directory` (a `modes.PolicySource`)."""

    def __init__(self, directory: str | Path, *, interval: float = 1.0, use_inotify: bool = True) -> None:
        super().__init__(directory, name="rbac-manifests", interval=interval, use_inotify=use_inotify)
        self.current: RBACPolicy = compile_policy((), present=False)
        self._listeners: list[Listener] = []
        self._problems: dict[Path, tuple[ManifestProblem, ...]] = {}  # only files with problems

    def problems(self) -> list[ManifestProblem]:
        """RBAC objects refused now, file by file (`sources/problems.py`)."""
        return problems_by_file(self._problems)

    def add_listener(self, listener: Listener) -> None:
        """Called after each change with the new and the previous policy."""
        self._listeners.append(listener)

    def _counts(self, state: _FileState) -> bool:
        return state.holds_rbac

    def _noted(self, path: Path, state: _FileState | None) -> None:
        if state is not None and state.problems:
            self._problems[path] = state.problems
        else:
            self._problems.pop(path, None)

    def _read(self, path: Path, fingerprint: FileFingerprint, previous: _FileState | None) -> _FileState:
        kept = previous.objects if previous is not None else {}
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            if previous is None or not previous.holds_rbac:
                return _FileState(fingerprint)  # the folder source reports the file; it held no RBAC
            return self._unreadable(path, fingerprint, previous, f"{path}: {err}", mentions=True)
        if GROUP not in text:
            return _FileState(fingerprint)
        try:
            docs = read_documents(path)
        except ParseError as err:
            return self._unreadable(path, fingerprint, previous, str(err), mentions=True)
        objects: dict[ObjectKey, RBACObject] = {}
        problems: list[ManifestProblem] = []
        holds_rbac = False
        for index, doc in enumerate(d for raw in docs for d in flatten(raw)):
            if not isinstance(doc, Mapping) or not is_rbac(doc):
                continue
            holds_rbac = True
            try:
                obj = decode(doc)
            except Refused as err:
                key = _doc_key(doc)
                previous_obj = kept.get(key)
                log.error(
                    "RBAC manifest refused; %s",
                    "its previous version stays in force"
                    if previous_obj is not None
                    else "it grants nothing",
                    extra=fields(file=str(path), document=index, reason=str(err)),
                )
                if previous_obj is not None:
                    objects[key] = previous_obj
                problems.append(ManifestProblem(path, REFUSED, str(err), int(previous_obj is not None)))
                continue
            objects[key_of(obj)] = obj
        return _FileState(fingerprint, objects, holds_rbac, tuple(problems))

    @staticmethod
    def _unreadable(
        path: Path,
        fingerprint: FileFingerprint,
        previous: _FileState | None,
        reason: str,
        *,
        mentions: bool,
    ) -> _FileState:
        kept = dict(previous.objects) if previous is not None else {}
        log_not_loaded(log, "RBAC manifest", path, reason, len(kept))
        return _FileState(
            fingerprint, kept, holds_rbac=mentions or (previous is not None and previous.holds_rbac)
        )

    def _publish(self) -> None:
        merged = merge_by_file(
            {path: state.objects for path, state in self._files.items()}, "RBAC", lambda key: (key[0], key[2])
        )
        present = any(state.holds_rbac for state in self._files.values())
        previous, self.current = self.current, compile_policy(merged.values(), present=present)
        counts = {kind: n for kind, n in sorted(self.current.counts.items())}
        if present:
            log.info("RBAC manifests loaded", extra=fields(directory=str(self.directory), **counts))
        for listener in self._listeners:
            listener(self.current, previous)
