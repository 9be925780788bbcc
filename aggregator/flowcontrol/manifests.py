"""FlowSchema and PriorityLevelConfiguration manifests -> objects, refused as kube-apiserver refuses them.

`kubectl apply` of a manifest to kube-apiserver runs strict field validation (an unknown field is a
400 with `strict decoding error: unknown field "spec.matchingPrecedense"`), Go's decoding (a field of
the wrong type), v1's defaults, then `ValidateFlowSchema` / `ValidatePriorityLevelConfiguration`;
a manifest read from the folder goes through the same steps and, refused, is reported with the same
message. The older versions (`v1beta1`..`v1beta3`) are not read: their defaults differ from v1's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.flowcontrol.bootstrap import MANDATORY_LEVEL_NAMES, MANDATORY_SCHEMA_NAMES
from aggregator.flowcontrol.objects import (
    API_VERSION,
    FLOW_SCHEMA,
    FLOW_SCHEMA_FIELDS,
    GROUP,
    PRIORITY_LEVEL,
    PRIORITY_LEVEL_FIELDS,
    FlowSchema,
    Object,
    PriorityLevel,
    decode_flow_schema,
    decode_priority_level,
)
from aggregator.flowcontrol.validation import validate_flow_schema, validate_priority_level
from aggregator.model import fielderrors as fe
from aggregator.model.decode import DecodeError
from aggregator.model.strict import strict_decoding_error, unknown_fields

KINDS = frozenset({FLOW_SCHEMA, PRIORITY_LEVEL})


class Refused(ValueError):
    """A manifest kube-apiserver would not store; the message is its answer's."""


@dataclass(frozen=True, slots=True)
class ConfigObjects:
    """Every priority level and FlowSchema there is (what `Controller.digest` takes)."""

    levels: tuple[PriorityLevel, ...] = ()
    schemas: tuple[FlowSchema, ...] = ()


def is_flowcontrol(doc: Mapping[str, Any]) -> bool:
    """A document of the flowcontrol API group (any version): this package's business."""
    api_version = doc.get("apiVersion")
    return isinstance(api_version, str) and api_version.startswith(GROUP + "/") and doc.get("kind") in KINDS


def qualified(kind: str) -> str:
    return f"{kind}.{GROUP}"


def _invalid(kind: str, name: str, errors: list[str]) -> str:
    """`apierrors.NewInvalid(...).Error()`: one error bare, several in brackets."""
    listed = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return f"{qualified(kind)} {fe.go_quote(name)} is invalid: {listed}"


def decode_manifest(doc: Mapping[str, Any]) -> Object:
    """One flowcontrol document (`is_flowcontrol`) -> its object; `Refused` with kube-apiserver's words."""
    api_version, kind = doc.get("apiVersion"), str(doc.get("kind"))
    if api_version != API_VERSION:
        raise Refused(f"{api_version} {kind} is not read by the gateway; use {API_VERSION}")
    unknown = unknown_fields(doc, FLOW_SCHEMA_FIELDS if kind == FLOW_SCHEMA else PRIORITY_LEVEL_FIELDS)
    if unknown:
        raise Refused(strict_decoding_error(kind, "v1", unknown))
    metadata = doc.get("metadata")
    name = str(metadata.get("name", "")) if isinstance(metadata, Mapping) else ""
    try:
        if kind == FLOW_SCHEMA:
            schema = decode_flow_schema(doc)
            errors = validate_flow_schema(schema, MANDATORY_SCHEMA_NAMES.get(schema.name))
            if errors:
                raise Refused(_invalid(kind, schema.name, errors))
            return schema
        level = decode_priority_level(doc)
        errors = validate_priority_level(level, MANDATORY_LEVEL_NAMES.get(level.name))
        if errors:
            raise Refused(_invalid(kind, level.name, errors))
        return level
    except DecodeError as err:
        raise Refused(f"{qualified(kind)} {fe.go_quote(name)} could not be decoded: {err}") from err
