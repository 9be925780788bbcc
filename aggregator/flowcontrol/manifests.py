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
                raise Refused(fe.invalid_object(qualified(kind), schema.name, errors))
            return schema
        level = decode_priority_level(doc)
        errors = validate_priority_level(level, MANDATORY_LEVEL_NAMES.get(level.name))
        if errors:
            raise Refused(fe.invalid_object(qualified(kind), level.name, errors))
        return level
    except DecodeError as err:
        raise Refused(f"{qualified(kind)} {fe.go_quote(name)} could not be decoded: {err}") from err


# --- encoding (as kube-apiserver serves them) ----------------------------------------------------------


def _meta(obj: Object) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": obj.meta.name}
    if obj.meta.uid:
        meta["uid"] = obj.meta.uid
    if obj.meta.resource_version:
        meta["resourceVersion"] = obj.meta.resource_version
    if obj.meta.generation:
        meta["generation"] = obj.meta.generation
    if obj.meta.annotations:
        meta["annotations"] = dict(obj.meta.annotations)
    return meta


def _subject(subject: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": subject.kind}
    if subject.user is not None:
        out["user"] = {"name": subject.user}
    if subject.group is not None:
        out["group"] = {"name": subject.group}
    if subject.service_account is not None:
        out["serviceAccount"] = {"namespace": subject.service_account[0], "name": subject.service_account[1]}
    return out


def encode(obj: Object) -> dict[str, Any]:
    """The object in v1 JSON form, as `kubectl get -o json` shows it (no status)."""
    if isinstance(obj, FlowSchema):
        spec = obj.spec
        rules = []
        for r in spec.rules:
            rule: dict[str, Any] = {"subjects": [_subject(s) for s in r.subjects]}
            if r.resource_rules:
                rule["resourceRules"] = [
                    {
                        "verbs": list(rr.verbs),
                        "apiGroups": list(rr.api_groups),
                        "resources": list(rr.resources),
                        **({"clusterScope": True} if rr.cluster_scope else {}),
                        **({"namespaces": list(rr.namespaces)} if rr.namespaces else {}),
                    }
                    for rr in r.resource_rules
                ]
            if r.non_resource_rules:
                rule["nonResourceRules"] = [
                    {"verbs": list(nr.verbs), "nonResourceURLs": list(nr.non_resource_urls)}
                    for nr in r.non_resource_rules
                ]
            rules.append(rule)
        fs_spec: dict[str, Any] = {
            "priorityLevelConfiguration": {"name": spec.priority_level},
            "matchingPrecedence": spec.matching_precedence,
        }
        if spec.distinguisher is not None:
            fs_spec["distinguisherMethod"] = {"type": spec.distinguisher}
        if rules:
            fs_spec["rules"] = rules
        return {"apiVersion": API_VERSION, "kind": FLOW_SCHEMA, "metadata": _meta(obj), "spec": fs_spec}
    pl_spec: dict[str, Any] = {"type": obj.spec.type}
    limited = obj.spec.limited
    if limited is not None:
        response: dict[str, Any] = {"type": limited.limit_response.type}
        queuing = limited.limit_response.queuing
        if queuing is not None:
            response["queuing"] = {
                "queues": queuing.queues,
                "handSize": queuing.hand_size,
                "queueLengthLimit": queuing.queue_length_limit,
            }
        pl_spec["limited"] = {
            "nominalConcurrencyShares": limited.nominal_concurrency_shares,
            "limitResponse": response,
            **({"lendablePercent": limited.lendable_percent} if limited.lendable_percent is not None else {}),
            **(
                {"borrowingLimitPercent": limited.borrowing_limit_percent}
                if limited.borrowing_limit_percent is not None
                else {}
            ),
        }
    exempt = obj.spec.exempt
    if exempt is not None:
        pl_spec["exempt"] = {
            **(
                {"nominalConcurrencyShares": exempt.nominal_concurrency_shares}
                if exempt.nominal_concurrency_shares is not None
                else {}
            ),
            **({"lendablePercent": exempt.lendable_percent} if exempt.lendable_percent is not None else {}),
        }
    return {"apiVersion": API_VERSION, "kind": PRIORITY_LEVEL, "metadata": _meta(obj), "spec": pl_spec}
