"""Strict field validation for the kinds a manifest folder may hold, as kube-apiserver does it.

`kubectl apply` asks kube-apiserver for `fieldValidation=Strict`, and a field the kind does not have
(`spec.versoin`) fails the object with `strict decoding error: unknown field "spec.versoin"`
(sigs.k8s.io/json `strictError`, joined by apimachinery `strictDecodingError`), which
`transformDecodeError` (apiserver `endpoints/handlers/rest.go`) prefixes with
`APIService in version "v1" cannot be handled as a APIService:`. Without this a typo only surfaces
as a missing required field, or not at all.

The field sets below are the Kubernetes API types' JSON names (`tests/model/test_strict.py` checks
them against the official client's models, which are generated from upstream's OpenAPI). Maps
of free-form keys (labels, selectors, `fieldsV1`) are leaves: their keys are data, not fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from aggregator.model.fielderrors import go_quote
from aggregator.model.meta import OBJECT_META_ORDER, OWNER_REFERENCE_ORDER

# A field: a leaf (a scalar, a list of scalars, or a free-form map), an object, or a list of objects.
Field = Union[None, "Fields", "ListOf"]
Fields = Mapping[str, Field]
LEAF: None = None


@dataclass(frozen=True)
class ListOf:
    """A list whose items are objects with these fields."""

    item: Fields


def _leaves(*names: str) -> dict[str, Field]:
    return dict.fromkeys(names, LEAF)


# metav1.ObjectMeta: `meta.py`'s names, the two lists of objects among them with their items' fields.
OBJECT_META: Fields = {
    **_leaves(*OBJECT_META_ORDER),
    "ownerReferences": ListOf(_leaves(*OWNER_REFERENCE_ORDER)),
    "managedFields": ListOf(
        _leaves("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")
    ),
}


def _object(**fields: Field) -> Fields:
    """A top-level object: TypeMeta, ObjectMeta and the kind's own fields."""
    return {**_leaves("apiVersion", "kind"), "metadata": OBJECT_META, **fields}


# apiregistration.k8s.io/v1 APIService
APISERVICE: Fields = _object(
    spec={
        "service": _leaves("namespace", "name", "port"),
        **_leaves(
            "group", "version", "insecureSkipTLSVerify", "caBundle", "groupPriorityMinimum", "versionPriority"
        ),
    },
    status={"conditions": ListOf(_leaves("type", "status", "lastTransitionTime", "reason", "message"))},
)

# metav1.Condition
_CONDITION = _leaves("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")

# core/v1 Service
SERVICE: Fields = _object(
    spec={
        "ports": ListOf(_leaves("name", "protocol", "appProtocol", "port", "targetPort", "nodePort")),
        "sessionAffinityConfig": {"clientIP": _leaves("timeoutSeconds")},
        **_leaves(
            "selector",
            "clusterIP",
            "clusterIPs",
            "type",
            "externalIPs",
            "sessionAffinity",
            "loadBalancerIP",
            "loadBalancerSourceRanges",
            "externalName",
            "externalTrafficPolicy",
            "healthCheckNodePort",
            "publishNotReadyAddresses",
            "ipFamilies",
            "ipFamilyPolicy",
            "allocateLoadBalancerNodePorts",
            "loadBalancerClass",
            "internalTrafficPolicy",
            "trafficDistribution",
        ),
    },
    status={
        "loadBalancer": {
            "ingress": ListOf(
                {
                    **_leaves("ip", "hostname", "ipMode"),
                    "ports": ListOf(_leaves("port", "protocol", "error")),
                }
            )
        },
        "conditions": ListOf(_CONDITION),
    },
)

# discovery.k8s.io/v1 EndpointSlice
ENDPOINT_SLICE: Fields = _object(
    addressType=LEAF,
    endpoints=ListOf(
        {
            **_leaves("addresses", "hostname", "deprecatedTopology", "nodeName", "zone"),
            "conditions": _leaves("ready", "serving", "terminating"),
            "targetRef": _leaves(
                "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"
            ),
            "hints": {"forZones": ListOf(_leaves("name")), "forNodes": ListOf(_leaves("name"))},
        }
    ),
    ports=ListOf(_leaves("name", "protocol", "port", "appProtocol")),
)


def unknown_fields(value: Any, fields: Fields, path: str = "") -> list[str]:
    """Paths in `value` (decoded JSON) that `fields` does not define, in document order, as the
    strict decoder writes them (`spec.ports[0].nmae`). A value of the wrong type is the
    decoder's business, not this walk's: it is skipped."""
    if not isinstance(value, Mapping):
        return []
    found: list[str] = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            found.append(where)
            continue
        field = fields[key]
        if isinstance(field, ListOf):
            if isinstance(item, list):
                for index, element in enumerate(item):
                    found.extend(unknown_fields(element, field.item, f"{where}[{index}]"))
        elif field is not None:
            found.extend(unknown_fields(item, field, where))
    return found


def strict_decoding_error(kind: str, version: str, paths: list[str]) -> str:
    """The message kube-apiserver answers a strict create or update with (400 BadRequest)."""
    listed = ", ".join(f"unknown field {go_quote(p)}" for p in paths)
    return f"{kind} in version {go_quote(version)} cannot be handled as a {kind}: strict decoding error: {listed}"
