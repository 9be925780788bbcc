"""Request bodies: JSON or YAML, checked field by field against the versioned type.

What apiserver's strict decoder (sigs.k8s.io/json) reports: unknown fields (`unknown field
"spec.foo"`), duplicate fields (`duplicate field "metadata.name"`) and type mismatches (Go's
`json: cannot unmarshal ...`). The request's `fieldValidation` decides whether the first two fail
the request (Strict), become `Warning` headers (Warn, the default) or are dropped (Ignore).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from sample_apiserver.api import ResourceType

JSON = dict[str, Any]

# A field's type: a Go-ish scalar name, a struct (dict of fields), or a list of structs.
FieldType = Any

OWNER_REFERENCE: dict[str, FieldType] = {
    "apiVersion": "string",
    "kind": "string",
    "name": "string",
    "uid": "string",
    "controller": "bool",
    "blockOwnerDeletion": "bool",
}
MANAGED_FIELDS_ENTRY: dict[str, FieldType] = {
    "manager": "string",
    "operation": "string",
    "apiVersion": "string",
    "time": "time",
    "fieldsType": "string",
    "fieldsV1": "any",
    "subresource": "string",
}
OBJECT_META: dict[str, FieldType] = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "selfLink": "string",
    "uid": "string",
    "resourceVersion": "string",
    "generation": "int64",
    "creationTimestamp": "time",
    "deletionTimestamp": "time",
    "deletionGracePeriodSeconds": "int64",
    "labels": "map[string]string",
    "annotations": "map[string]string",
    "ownerReferences": ("list", OWNER_REFERENCE),
    "finalizers": "[]string",
    "managedFields": ("list", MANAGED_FIELDS_ENTRY),
}


def object_schema(resource: ResourceType, version: str) -> dict[str, FieldType]:
    top: dict[str, FieldType] = {"kind": "string", "apiVersion": "string", "metadata": OBJECT_META}
    if resource.kind == "Flunder":
        if version == "v1alpha1":
            top["spec"] = {"reference": "string", "referenceType": "string"}
        else:
            top["spec"] = {
                "flunderReference": "string",
                "fischerReference": "string",
                "referenceType": "string",
            }
        top["status"] = {}
    else:
        top["disallowedFlunders"] = "[]string"
    return top


class DecodeError(ValueError):
    """The body is not a usable document (syntax or type error)."""


class _Object(dict[str, Any]):
    """A JSON object that remembers keys it saw more than once."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.duplicates = []
    for key, value in pairs:
        if key in obj and key not in obj.duplicates:
            obj.duplicates.append(key)
        obj[key] = value
    return obj


def parse_body(body: bytes, content_type: str) -> Any:
    """Parse JSON (default) or YAML; raises DecodeError with a Go-like message."""
    if content_type in ("application/yaml", "application/apply-patch+yaml"):
        try:
            doc = yaml.safe_load(body.decode("utf-8")) if body.strip() else None
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise DecodeError(f"error converting YAML to JSON: {err}") from err
        # Round-trip through JSON so duplicate detection and types match the JSON path.
        return json.loads(json.dumps(doc), object_pairs_hook=_pairs)
    try:
        return json.loads(body, object_pairs_hook=_pairs)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DecodeError(f"couldn't get version/kind; json parse error: {err}") from err


_JSON_KIND = {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number"}
_GO_TYPE = {
    "string": "string",
    "int64": "int64",
    "bool": "bool",
    "time": "string",
    "map[string]string": "map[string]string",
    "[]string": "[]string",
}


@dataclass
class FieldProblems:
    unknown: list[str] = field(default_factory=list)  # messages in document order
    type_error: str | None = None

    @property
    def strict_errors(self) -> list[str]:
        return self.unknown


def _kind_of(value: Any) -> str:
    for py_type, name in _JSON_KIND.items():
        if type(value) is py_type:
            return name
    return "null"


def check_fields(doc: Any, schema: dict[str, FieldType], type_name: str) -> FieldProblems:
    problems = FieldProblems()

    def mismatch(path: str, value: Any, go_type: str) -> None:
        if problems.type_error is None:
            problems.type_error = f"json: cannot unmarshal {_kind_of(value)} into Go struct field {type_name}.{path} of type {go_type}"

    def walk(value: Any, spec: FieldType, path: str) -> None:
        if value is None or spec == "any":
            return
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                mismatch(path, value, "struct")
                return
            for dup in getattr(value, "duplicates", []):
                problems.unknown.append(f'duplicate field "{_join(path, dup)}"')
            for key, child in value.items():
                child_path = _join(path, key)
                if key not in spec:
                    problems.unknown.append(f'unknown field "{child_path}"')
                else:
                    walk(child, spec[key], child_path)
            return
        if isinstance(spec, tuple):
            if not isinstance(value, list):
                mismatch(path, value, "[]struct")
                return
            for i, item in enumerate(value):
                walk(item, spec[1], f"{path}[{i}]")
            return
        if spec in ("string", "time"):
            if not isinstance(value, str):
                mismatch(path, value, _GO_TYPE[spec])
        elif spec == "int64":
            if type(value) is not int:
                mismatch(path, value, "int64")
        elif spec == "bool":
            if type(value) is not bool:
                mismatch(path, value, "bool")
        elif spec == "map[string]string":
            if not isinstance(value, dict):
                mismatch(path, value, spec)
                return
            for dup in getattr(value, "duplicates", []):
                problems.unknown.append(f'duplicate field "{_join(path, dup)}"')
            for key, item in value.items():
                if item is not None and not isinstance(item, str):
                    mismatch(_join(path, key), item, "string")
        elif spec == "[]string":
            if not isinstance(value, list):
                mismatch(path, value, spec)
                return
            for item in value:
                if item is not None and not isinstance(item, str):
                    mismatch(path, item, "string")

    if not isinstance(doc, dict):
        problems.type_error = f"json: cannot unmarshal {_kind_of(doc)} into Go value of type {type_name}"
        return problems
    walk(doc, schema, "")
    return problems


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def plain(value: Any) -> Any:
    """Drop the duplicate bookkeeping: plain dicts and lists all the way down."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
