"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902, the `jsonpatch` package),
strategic merge patch.

The wardle types have no list with a merge strategy of their own, so a strategic merge patch is
applied as a merge patch; its `$patch: replace|delete` map directives are honoured and the other
`$`-directives (`$setElementOrder/...`, `$retainKeys`, `$deleteFromPrimitiveList/...`) only ever
refine list merges, which these types do not have, so they are dropped.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer


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


# --- RFC 6902, by the jsonpatch package, worded as upstream -----------------------------------------


def json_patch(doc: Any, operations: Any) -> Any:
    """Apply an RFC 6902 operation list (the `jsonpatch` package) to a copy of `doc`; errors read
    like evanphx/json-patch's, which kube-apiserver answers with.

    Operations are applied one at a time so a failure names its operation's path, and a missing
    member is reported by its path, never with the document (jsonpointer's message quotes it).
    """
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch", 400)
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict):
            raise PatchError("json: cannot unmarshal into Go value of type jsonpatch.Operation", 400)
        kind = op.get("op")
        path = op.get("path")
        if kind not in _OPERATIONS:
            raise PatchError(f"Unexpected kind: {kind}")
        if not isinstance(path, str):
            raise PatchError("operation missing path field")
        if kind in ("move", "copy") and not isinstance(op.get("from"), str):
            raise PatchError(f"{kind} operation missing from field")
        try:
            doc = jsonpatch.apply_patch(doc, [op], in_place=True)
        except jsonpatch.JsonPatchTestFailed as err:
            raise PatchError(f"testing value {path} failed: test failed") from err
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as err:
            raise PatchError(_missing(kind, op, path)) from err
    return doc


_OPERATIONS = frozenset({"add", "remove", "replace", "move", "copy", "test"})


def _missing(kind: str, op: dict[str, Any], path: str) -> str:
    """evanphx/json-patch's words for an operation whose path (or `from`) is not in the document."""
    where = op["from"] if kind in ("move", "copy") else path
    if kind == "remove":
        return f"unable to remove nonexistent key: {path.rpartition('/')[2]}: missing value"
    return f'doc is missing path: "{where}": missing value'
