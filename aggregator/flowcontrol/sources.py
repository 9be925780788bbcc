"""Where the APF configuration comes from: the cluster (kube mode), the folder (local mode), or
kube-apiserver's bootstrap objects alone.

- Kube mode: `flowcontrol.apiserver.k8s.io/v1` FlowSchemas and PriorityLevelConfigurations by list +
  watch (`sources/reflector.py`), as kube-apiserver's own APF controller follows them (informers on
  both). kube-apiserver has already ensured the bootstrap objects and validated everything, so the
  objects are used as listed (UIDs included: the response headers name the cluster's objects); an
  object that does not decode is logged and its previous version kept. Readiness waits for both lists.
- Local mode: the folder's manifests of those kinds (only files that mention the group are parsed),
  reloaded on change. Each is checked as `kubectl apply` has kube-apiserver check it
  (`manifests.py`); a refused one is logged with its file, document and kube-apiserver's message
  (which names the field), and the others apply (a refused object's previous valid version stays).
  Then kube-apiserver's ensurer runs on the result (`bootstrap.ensure`): an empty folder gives the
  bootstrap configuration, as a new cluster has. Objects without a UID get a stable one.
- Neither (local mode without a folder): the bootstrap configuration.

Each source publishes `current` (a `ConfigObjects`) and tells its listeners when it changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aggregator.flowcontrol.bootstrap import ensure, with_uid
from aggregator.flowcontrol.manifests import ConfigObjects, Refused, decode_manifest, is_flowcontrol
from aggregator.flowcontrol.objects import (
    API_VERSION,
    FLOW_SCHEMA,
    GROUP,
    PRIORITY_LEVEL,
    FlowSchema,
    Object,
    PriorityLevel,
    decode_flow_schema,
    decode_priority_level,
)
from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.model.decode import DecodeError
from aggregator.sources.files import ParseError, log_not_loaded, merge_by_file, read_documents
from aggregator.sources.folder import FileFingerprint, FolderReader
from aggregator.sources.manifests import flatten
from aggregator.sources.problems import REFUSED, ManifestProblem
from aggregator.sources.reflector import ListWatch, Reflector, paged_list
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

CHECK_NAME = "priority-and-fairness-config-synced"
Listener = Callable[[ConfigObjects], None]


class ConfigSource(Protocol):
    """What the APF runtime follows (`runtime.FlowControl`)."""

    current: ConfigObjects

    def add_listener(self, listener: Listener) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def bootstrap_config() -> ConfigObjects:
    """kube-apiserver's bootstrap objects, as its ensurer creates them in a new cluster."""
    levels, schemas = ensure((), ())
    return ConfigObjects(
        tuple(with_uid(o, PRIORITY_LEVEL) for o in levels),  # type: ignore[misc]
        tuple(with_uid(o, FLOW_SCHEMA) for o in schemas),  # type: ignore[misc]
    )


class _Listeners:
    def __init__(self) -> None:
        self.current = ConfigObjects()
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def publish(self, config: ConfigObjects) -> None:
        if config == self.current:
            return
        self.current = config
        for listener in self._listeners:
            listener(config)


class StaticConfig(_Listeners):
    """The bootstrap configuration, for a gateway with neither a cluster nor a folder."""

    def __init__(self) -> None:
        super().__init__()
        self.current = bootstrap_config()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class HeldConfig(_Listeners):
    """A configuration someone else follows: a worker process holds the control process's copy."""

    def use(self, config: ConfigObjects) -> None:
        self.publish(config)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


# --- kube mode -----------------------------------------------------------------------------------------


class _Collection:
    """One watched kind: decoded objects by name (a `ReflectorTarget`)."""

    def __init__(self, kind: str, decode: Callable[[Mapping[str, Any]], Object], changed: Callable[[], None]) -> None:
        self.kind = kind
        self.decode = decode
        self.changed = changed
        self.objects: dict[str, Object] = {}

    def _decoded(self, obj: Mapping[str, Any]) -> Object | None:
        try:
            return self.decode(obj)
        except DecodeError as err:
            metadata = obj.get("metadata")
            name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
            log.error(
                "skipping malformed object; keeping the previous version if any",
                extra=fields(kind=self.kind, name=name, reason=str(err)),
            )
            return None

    def replace(self, items: list[Any]) -> None:
        objects: dict[str, Object] = {}
        for item in items:
            if not isinstance(item, dict):
                continue
            decoded = self._decoded(item)
            if decoded is not None:
                objects[decoded.name] = decoded
            else:
                name = (item.get("metadata") or {}).get("name")
                if name in self.objects:
                    objects[name] = self.objects[name]
        self.objects = objects
        self.changed()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str):
            return
        if event_type == "DELETED":
            if self.objects.pop(name, None) is not None:
                self.changed()
            return
        decoded = self._decoded(obj)
        if decoded is not None:
            self.objects[name] = decoded
            self.changed()


class KubeConfig(_Listeners):
    """The cluster's FlowSchemas and PriorityLevelConfigurations, listed and watched."""

    def __init__(self, client: KubeClient) -> None:
        super().__init__()
        # Until both kinds are listed, the mandatory configuration alone (upstream's controller
        # starts from it too).
        self.current = ConfigObjects()
        self._tasks = TaskSet("flowcontrol-config")
        self.levels = _Collection(PRIORITY_LEVEL, decode_priority_level, self._changed)
        self.schemas = _Collection(FLOW_SCHEMA, decode_flow_schema, self._changed)
        self.reflectors = [
            Reflector(client, ListWatch(name, paged_list(list_call, name), watch_call), target)
            for name, list_call, watch_call, target in (
                (
                    "prioritylevelconfigurations",
                    calls.LIST_PRIORITYLEVELCONFIGURATIONS,
                    calls.WATCH_PRIORITYLEVELCONFIGURATIONS,
                    self.levels,
                ),
                ("flowschemas", calls.LIST_FLOWSCHEMAS, calls.WATCH_FLOWSCHEMAS, self.schemas),
            )
        ]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def ready_check(self) -> str | None:
        """readyz `priority-and-fairness-config-synced`."""
        if self.synced:
            return None
        return "the cluster's FlowSchemas and PriorityLevelConfigurations are not listed yet"

    def _changed(self) -> None:
        if not self.synced:
            return  # one consistent configuration once both are listed
        levels = tuple(sorted(self.levels.objects.values(), key=lambda o: o.name))
        schemas = tuple(sorted(self.schemas.objects.values(), key=lambda o: o.name))
        self.publish(ConfigObjects(levels, schemas))  # type: ignore[arg-type]

    async def start(self) -> None:
        for reflector in self.reflectors:
            self._tasks.spawn(reflector.run(), name=reflector.name)
        self._tasks.spawn(self._first_sync(), name="synced")

    async def _first_sync(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        self._changed()
        log.info(
            "API Priority and Fairness configuration listed",
            extra=fields(priority_levels=len(self.levels.objects), flow_schemas=len(self.schemas.objects)),
        )

    async def stop(self) -> None:
        await self._tasks.close()


# --- local mode ---------------------------------------------------------------------------------------


@dataclass
class _FileState:
    fingerprint: FileFingerprint
    objects: dict[tuple[str, str], Object] = field(default_factory=dict)
    problems: tuple[ManifestProblem, ...] = ()


class FolderConfig(_Listeners, FolderReader[_FileState]):
    """The folder's FlowSchemas and PriorityLevelConfigurations, ensured as kube-apiserver would."""

    def __init__(self, directory: str | Path, *, interval: float = 1.0, use_inotify: bool = True) -> None:
        _Listeners.__init__(self)
        FolderReader.__init__(
            self, directory, name="flowcontrol-manifests", interval=interval, use_inotify=use_inotify
        )
        self.current = bootstrap_config()

    def problems(self) -> list[ManifestProblem]:
        """The objects refused now, file by file (`sources/problems.py`: `check --all`, `/readyz?verbose`,
        `aggregator_manifest_errors`); the files that do not parse are the folder source's."""
        return [problem for path in sorted(self._files) for problem in self._files[path].problems]

    def _counts(self, state: _FileState) -> bool:
        return bool(state.objects)

    def _read(self, path: Path, fingerprint: FileFingerprint, previous: _FileState | None) -> _FileState:
        kept = previous.objects if previous is not None else {}
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return _FileState(fingerprint, dict(kept))  # the folder source reports the file
        if GROUP not in text:
            return _FileState(fingerprint)
        try:
            docs = read_documents(path)
        except ParseError as err:
            log_not_loaded(log, "APF manifest", path, str(err), len(kept))
            return _FileState(fingerprint, dict(kept))
        objects: dict[tuple[str, str], Object] = {}
        problems: list[ManifestProblem] = []
        for index, doc in enumerate(d for raw in docs for d in flatten(raw)):
            if not isinstance(doc, Mapping) or not is_flowcontrol(doc):
                continue
            kind = str(doc.get("kind"))
            metadata = doc.get("metadata")
            name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
            try:
                obj = decode_manifest(doc)
            except Refused as err:
                previous_obj = kept.get((kind, name))
                log.error(
                    "%s manifest refused; %s",
                    kind,
                    "its previous version stays in force"
                    if previous_obj is not None
                    else "the other objects apply",
                    extra=fields(file=str(path), document=index, name=name, reason=str(err)),
                )
                problems.append(ManifestProblem(path, REFUSED, str(err), int(previous_obj is not None)))
                if previous_obj is not None:
                    objects[(kind, name)] = previous_obj
                continue
            objects[(kind, obj.name)] = obj
        return _FileState(fingerprint, objects, tuple(problems))

    def _publish(self) -> None:
        merged = merge_by_file(
            {path: state.objects for path, state in self._files.items()}, "APF", lambda key: key
        )
        levels = [
            o for (kind, _), o in merged.items() if kind == PRIORITY_LEVEL and isinstance(o, PriorityLevel)
        ]
        schemas = [o for (kind, _), o in merged.items() if kind == FLOW_SCHEMA and isinstance(o, FlowSchema)]
        ensured_levels, ensured_schemas = ensure(levels, schemas)
        config = ConfigObjects(
            tuple(sorted((with_uid(o, PRIORITY_LEVEL) for o in ensured_levels), key=lambda o: o.name)),  # type: ignore[misc]
            tuple(sorted((with_uid(o, FLOW_SCHEMA) for o in ensured_schemas), key=lambda o: o.name)),  # type: ignore[misc]
        )
        if config != self.current:
            log.info(
                "API Priority and Fairness configuration loaded",
                extra=fields(
                    directory=str(self.directory),
                    priority_levels=len(config.levels),
                    flow_schemas=len(config.schemas),
                    from_folder=len(merged),
                ),
            )
        self.publish(config)


__all__ = [
    "API_VERSION",
    "CHECK_NAME",
    "ConfigSource",
    "FolderConfig",
    "KubeConfig",
    "StaticConfig",
    "bootstrap_config",
]
