"""Strict field validation: the field sets are the Kubernetes types', and the words are upstream's."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from aggregator.model.strict import (
    APISERVICE,
    ENDPOINT_SLICE,
    SERVICE,
    Fields,
    ListOf,
    strict_decoding_error,
    unknown_fields,
)

_LIST = re.compile(r"^List\[(.+)\]$")


def model_paths(type_name: str, prefix: str = "") -> set[str]:
    """Every field path the official client's model defines (`spec.ports[].name`), maps as leaves."""
    model = getattr(importlib.import_module("kubernetes.client.models"), type_name, None)
    if model is None:
        return set()  # a primitive, `object` or `Dict[str, ...]`: a leaf
    paths = set()
    for attr, json_name in model.attribute_map.items():
        path = f"{prefix}.{json_name}" if prefix else json_name
        paths.add(path)
        item_type = model.openapi_types[attr]
        if match := _LIST.match(item_type):
            paths |= model_paths(match[1], path + "[]")
        else:
            paths |= model_paths(item_type, path)
    return paths


def our_paths(fields: Fields, prefix: str = "") -> set[str]:
    paths = set()
    for name, field in fields.items():
        path = f"{prefix}.{name}" if prefix else name
        paths.add(path)
        if isinstance(field, ListOf):
            paths |= our_paths(field.item, path + "[]")
        elif field is not None:
            paths |= our_paths(field, path)
    return paths


@pytest.mark.parametrize(
    ("fields", "model"),
    [(APISERVICE, "V1APIService"), (SERVICE, "V1Service"), (ENDPOINT_SLICE, "V1EndpointSlice")],
)
def test_the_field_sets_are_the_kubernetes_types(fields: Fields, model: str) -> None:
    assert our_paths(fields) == model_paths(model)


def test_unknown_fields_are_found_in_document_order_with_list_indexes() -> None:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metdata": {"name": "x"},
        "spec": {
            "ports": [{"port": 1, "nmae": "a"}, "not an object", {"port": 2, "targetPrt": 3}],
            "selector": {"free": "form", "keys": "allowed"},
            "type": ["a wrong type is the decoder's business"],
            "sessionAffinityConfig": {"clientIP": {"timeoutSecond": 5}},
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "ports": [{"port": 1, "eror": "x"}]}]}},
    }
    assert unknown_fields(doc, SERVICE) == [
        "metdata",
        "spec.ports[0].nmae",
        "spec.ports[2].targetPrt",
        "spec.sessionAffinityConfig.clientIP.timeoutSecond",
        "status.loadBalancer.ingress[0].ports[0].eror",
    ]


def test_a_valid_object_has_none() -> None:
    doc = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": "v1.x.io",
            "labels": {"a": "b"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:group": {}}}}],
        },
        "spec": {"group": "x.io", "version": "v1", "service": {"namespace": "n", "name": "s", "port": 443}},
        "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]},
    }
    assert unknown_fields(doc, APISERVICE) == []


def test_the_message_is_kube_apiservers() -> None:
    # apiserver endpoints/handlers/rest.go transformDecodeError, around runtime.strictDecodingError
    assert strict_decoding_error("APIService", "v1", ["spec.versoin"]) == (
        'APIService in version "v1" cannot be handled as a APIService: strict decoding error: '
        'unknown field "spec.versoin"'
    )
    assert strict_decoding_error("EndpointSlice", "v1", ["a", "b"]).endswith(
        'strict decoding error: unknown field "a", unknown field "b"'
    )
