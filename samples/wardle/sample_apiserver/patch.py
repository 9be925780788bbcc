"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch.

The wardle types have no list with a merge strategy of their own, so a strategic merge patch is
applied as a merge patch; its `$patch: replace|delete` map directives are honoured and the other
`$`-directives (`$setElementOrder/...`, `$retainKeys`, `$deleteFromPrimitiveList/...`) only ever
refine list merges, which these types do not have, so they are dropped.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that does not apply; `code` is the HTTP status upstream answers with."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if not k.startswith("$")}
    if directive == "replace":
        return copy.deepcopy(body)
    if directive is not None:
        raise PatchError(f"Unknown patch type: {directive}", 422)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in body.items():
        if value is None:
            result.pop(key, None)
            continue
        merged = strategic_merge_patch(result.get(key), value)
        if merged is None and isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = merged
    return result


# --- RFC 6902 ---------------------------------------------------------------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'JSON pointer must be empty or start with a "/": {path}')
    return [_unescape(t) for t in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise PatchError(f"invalid array index: {token}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"index out of range: {index}")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f'doc is missing path: "{path}": missing value')
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f'doc is missing path: "{path}": missing value')
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False)]
    raise PatchError(f'doc is missing path: "{path}": missing value')


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), copy.deepcopy(value))
    else:
        raise PatchError(f'doc is missing path: "{path}": missing value')
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("unable to remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, allow_end=False))
    raise PatchError(f'doc is missing path: "{path}": missing value')


def json_patch(doc: Any, operations: Any) -> Any:
    """Apply an RFC 6902 operation list; errors read like evanphx/json-patch's."""
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch", 400)
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict):
            raise PatchError("json: cannot unmarshal into Go value of type jsonpatch.Operation", 400)
        kind = op.get("op")
        path = op.get("path")
        if not isinstance(path, str):
            raise PatchError(f"Unexpected kind: {kind}" if kind is None else "operation missing path field")
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc, _ = _remove(doc, path) if _pointer(path) else (doc, None)
            doc = _add(doc, path, op.get("value"))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(f"{kind} operation missing from field")
            if kind == "move":
                doc, value = _remove(doc, source)
            else:
                value = copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    return doc
