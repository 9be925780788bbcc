"""Merging OpenAPI v2 documents the way kube-openapi's aggregator does.

A port of `MergeSpecsIgnorePathConflictRenamingDefinitionsAndParameters` and
`FilterSpecByPathsWithoutSideEffects` (kube-openapi `pkg/aggregator`), over plain JSON values:
- documents merge in order; the first one's metadata (`swagger`, `info`, `securityDefinitions`,
  ...) is kept, paths/definitions/parameters are merged;
- a path already present wins: the later document's conflicting paths are dropped, and with them
  the definitions only they used;
- a definition with the same name and a different body is renamed `<name>_v2` (`_v3`, ...) in the
  later document, every `$ref` to it rewritten; an earlier `_vN` with an equal body is reused;
  bodies that differ only in `x-kubernetes-group-version-kind` are one definition whose GVK list
  is the sorted union; shared `parameters` are renamed the same way.

Differences from upstream, on purpose: inputs are never mutated (upstream's GVK merge writes into
a map the source shares), names are visited in sorted order (Go map order picks `_v2` vs `_v3`
at random when several documents conflict), the conflicting-path filter matches whole paths
(upstream passes the kept paths as prefixes, so a kept `/a/` also keeps a conflicting `/a/b` and
the merge then fails), and `$ref`s reached through shared parameters count as uses (a definition
used only by a `#/parameters/...` body is not pruned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

DEFINITION_PREFIX = "#/definitions/"
PARAMETER_PREFIX = "#/parameters/"
GVK_KEY = "x-kubernetes-group-version-kind"
_MERGED_SECTIONS = ("paths", "definitions", "parameters")
# go-openapi's SwaggerProps field order, which is how Go writes a merged document.
_TOP_LEVEL_ORDER = (
    "id",
    "consumes",
    "produces",
    "schemes",
    "swagger",
    "info",
    "host",
    "basePath",
    "paths",
    "definitions",
    "parameters",
    "responses",
    "securityDefinitions",
    "security",
    "tags",
    "externalDocs",
)


class MergeError(ValueError):
    """A document that cannot be merged into the others (upstream fails the whole merge)."""


def _refs(node: Any) -> Iterator[str]:
    """Every `$ref` string inside `node` (without following them)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "$ref" and isinstance(value, str):
                    yield value
                elif isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))


def _path_items(paths: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Paths without the `x-` vendor extensions that may sit beside them."""
    return ((k, v) for k, v in paths.items() if not k.startswith("x-"))


def used_references(spec: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the definitions and shared parameters reachable from the document's paths."""
    used_definitions: set[str] = set()
    used_parameters: set[str] = set()
    # What a reference may point at: its prefix, the names used so far, the document's section.
    kinds = (
        (DEFINITION_PREFIX, used_definitions, spec.get("definitions") or {}),
        (PARAMETER_PREFIX, used_parameters, spec.get("parameters") or {}),
    )
    pending: list[Any] = [dict(_path_items(spec.get("paths") or {}))]
    while pending:
        for ref in _refs(pending.pop()):
            for prefix, used, section in kinds:
                if ref.startswith(prefix):
                    name = ref[len(prefix) :]
                    if name not in used:
                        used.add(name)
                        if name in section:
                            pending.append(section[name])
                    break
    return used_definitions, used_parameters


def filter_paths(spec: JSON, keep: Callable[[str], bool]) -> JSON:
    """The document with only the paths `keep` accepts, and without what only the others used.

    `FilterSpecByPathsWithoutSideEffects`: a definition (or shared parameter) is dropped only when
    some path used it before and none does after; ones no path ever used stay. The input is not
    modified; the result shares unchanged values with it.
    """
    paths = spec.get("paths")
    if paths is None:
        return spec
    kept = {k: v for k, v in paths.items() if k.startswith("x-") or keep(k)}
    if len(kept) == len(paths):
        return spec
    initial_definitions, initial_parameters = used_references(spec)
    out = dict(spec)
    out["paths"] = kept
    used_definitions, used_parameters = used_references(out)
    if "definitions" in spec:
        out["definitions"] = {
            k: v
            for k, v in (spec["definitions"] or {}).items()
            if k in used_definitions or k not in initial_definitions
        }
    if "parameters" in spec:
        out["parameters"] = {
            k: v
            for k, v in (spec["parameters"] or {}).items()
            if k in used_parameters or k not in initial_parameters
        }
    return out


def keep_prefixes(prefixes: Iterable[str]) -> Callable[[str], bool]:
    """A `filter_paths` predicate keeping paths under any of `prefixes` (upstream's trie)."""
    chosen = tuple(prefixes)
    return lambda path: path.startswith(chosen)


def drop_prefixes(prefixes: Iterable[str]) -> Callable[[str], bool]:
    chosen = tuple(prefixes)
    return lambda path: not path.startswith(chosen)


# --- renaming ---------------------------------------------------------------------------------------


def replace_refs(node: Any, renames: Mapping[str, str]) -> Any:
    """`node` with `$ref` values renamed; unchanged subtrees are shared, never copied or modified."""
    if isinstance(node, dict):
        copy: dict[str, Any] | None = None
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                new = renames.get(value, value)
            elif isinstance(value, dict | list):
                new = replace_refs(value, renames)
            else:
                continue
            if new is not value:
                if copy is None:
                    copy = dict(node)
                copy[key] = new
        return node if copy is None else copy
    if isinstance(node, list):
        items: list[Any] | None = None
        for index, value in enumerate(node):
            if not isinstance(value, dict | list):
                continue
            new = replace_refs(value, renames)
            if new is not value:
                if items is None:
                    items = list(node)
                items[index] = new
        return node if items is None else items
    return node


def _rename(spec: JSON, section: str, prefix: str, renames: Mapping[str, str]) -> JSON:
    """`renameDefinition`/`renameParameters`: the names in `section` and every `$ref` to them."""
    entries = spec.get(section) or {}
    if not any(name in entries for name in renames):
        return spec
    refs = {prefix + old: prefix + new for old, new in renames.items()}
    out: JSON = replace_refs(spec, refs)
    if out is spec:
        out = dict(spec)
    out[section] = {renames.get(k, k): v for k, v in (out.get(section) or {}).items()}
    return out


def _without_gvk(schema: Any) -> Any:
    if isinstance(schema, dict) and GVK_KEY in schema:
        return {k: v for k, v in schema.items() if k != GVK_KEY}
    return schema


def equal_modulo_gvks(a: Any, b: Any) -> bool:
    """`deepEqualDefinitionsModuloGVKs`."""
    return bool(a == b or _without_gvk(a) == _without_gvk(b))


def _gvk_key(gvk: Any) -> str:
    if not isinstance(gvk, dict):
        raise MergeError(f'expected {{"group": <group>, "kind": <kind>, "version": <version>}}, got: {gvk!r}')
    return f"{gvk.get('group')}/{gvk.get('version')}.{gvk.get('kind')}"


def merged_gvks(existing: Any, incoming: Any) -> tuple[Any, bool]:
    """`mergedGVKs`: the union of both GVK lists (sorted when it grew) and whether it changed."""
    first = existing.get(GVK_KEY) if isinstance(existing, dict) else None
    second = incoming.get(GVK_KEY) if isinstance(incoming, dict) else None
    if first is None:
        return second, second is not None
    if second is None:
        return first, False
    if not isinstance(first, list) or not isinstance(second, list):
        raise MergeError(f"expected slice of GroupVersionKinds, got: {first!r} and {second!r}")
    out = [(_gvk_key(g), g) for g in first]
    seen = {key for key, _ in out}
    changed = False
    for gvk in second:
        key = _gvk_key(gvk)
        if key not in seen:
            seen.add(key)
            out.append((key, gvk))
            changed = True
    if changed:
        out.sort(key=lambda pair: pair[0])
    return [g for _, g in out], changed


def _conflict_renames(
    dest: Mapping[str, Any], source: Mapping[str, Any], equal: Callable[[Any, Any], bool]
) -> dict[str, str]:
    """New names for the source entries whose name dest already uses for something different."""
    used = set(dest)
    renames: dict[str, str] = {}
    for name in sorted(source):
        value = source[name]
        if name not in dest or equal(dest[name], value):
            continue
        index = 2
        candidate = f"{name}_v{index}"
        reused = False
        while candidate in dest:  # reuse an earlier rename of the same body
            if equal(dest[candidate], value):
                reused = True
                break
            index += 1
            candidate = f"{name}_v{index}"
        if not reused:
            while candidate in used or candidate in source:
                index += 1
                candidate = f"{name}_v{index}"
            used.add(candidate)
        renames[name] = candidate
    return renames


def merge_into(dest: JSON, source: JSON) -> None:
    """Merge `source` into `dest`, whose `paths`/`definitions`/`parameters` dicts it owns.

    Raises MergeError for a document it cannot merge (malformed GVK lists); `dest` is then
    unchanged only if the error came before any copying, so callers merge into a fresh `dest`.
    """
    source_paths = source.get("paths")
    if not isinstance(source_paths, dict):
        return  # no paths: none of its definitions are used by anything
    dest_paths: JSON = dest.setdefault("paths", {})
    incoming = [k for k, _ in _path_items(source_paths)]
    kept = {k for k in incoming if k not in dest_paths}
    if not kept:
        return
    if len(kept) != len(incoming):
        source = filter_paths(source, kept.__contains__)

    definitions: JSON = dest.setdefault("definitions", {})
    source_definitions = source.get("definitions") or {}
    renames = _conflict_renames(definitions, source_definitions, equal_modulo_gvks)
    if renames:
        source = _rename(source, "definitions", DEFINITION_PREFIX, renames)
        source_definitions = source.get("definitions") or {}

    source_parameters = source.get("parameters") or {}
    if source_parameters:
        parameters: JSON = dest.setdefault("parameters", {})
        renames = _conflict_renames(parameters, source_parameters, lambda a, b: bool(a == b))
        if renames:
            source = _rename(source, "parameters", PARAMETER_PREFIX, renames)
            source_parameters = source.get("parameters") or {}

    updates: JSON = {}
    for name, schema in source_definitions.items():
        existing = definitions.get(name)
        if existing is None and name not in definitions:
            updates[name] = schema
            continue
        gvks, changed = merged_gvks(existing, schema)
        if changed:
            updates[name] = {**existing, GVK_KEY: gvks} if isinstance(existing, dict) else existing
    definitions.update(updates)
    if source_parameters:
        parameters = dest["parameters"]
        for name, parameter in source_parameters.items():
            parameters.setdefault(name, parameter)
    for path, item in _path_items(source.get("paths") or {}):
        dest_paths[path] = item


@dataclass(frozen=True, slots=True)
class MergeResult:
    document: JSON
    # (source name, reason) for each document that was left out
    skipped: tuple[tuple[str, str], ...]


def merge_documents(sources: Sequence[tuple[str, JSON]]) -> MergeResult:
    """Merge named documents in order; the first one's metadata heads the result.

    A document that cannot be merged is left out (upstream fails the whole merge and keeps serving
    the previous one: one broken backend would freeze everyone's OpenAPI).
    """
    merged: JSON | None = None
    skipped: list[tuple[str, str]] = []
    for name, spec in sources:
        if merged is None:
            merged = {k: v for k, v in spec.items() if k not in _MERGED_SECTIONS}
            merged["paths"] = {}
            merged["definitions"] = {}
        attempt = {**merged, **{k: dict(merged.get(k) or {}) for k in _MERGED_SECTIONS if k in merged}}
        try:
            merge_into(attempt, spec)
        except MergeError as err:
            skipped.append((name, str(err)))
            continue
        merged = attempt
    return MergeResult(ordered_document(merged or {}), tuple(skipped))


def ordered_document(spec: Mapping[str, Any]) -> JSON:
    """Top-level keys in Go's struct order; paths, definitions and parameters sorted like Go maps."""
    out: JSON = {}
    for key in _TOP_LEVEL_ORDER:
        if key not in spec:
            continue
        value = spec[key]
        if key in _MERGED_SECTIONS and isinstance(value, dict):
            if key != "paths" and not value:
                continue  # omitempty
            value = dict(sorted(value.items()))
        out[key] = value
    for key in sorted(k for k in spec if k not in out and k not in _TOP_LEVEL_ORDER):
        out[key] = spec[key]
    return out
