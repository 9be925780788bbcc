"""The gnostic protobuf encoding of OpenAPI v2, decoded back field by field.

The field numbers asserted here are OpenAPIv2.proto's (gnostic): Document.paths = 8,
definitions = 9, Schema.additional_properties = 21, ParametersItem.json_reference = 2, ...
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
import yaml
from sample_apiserver.openapi import build_v2
from sample_apiserver.openapi_pb import encode_document as sample_encode_document

from aggregator.openapi import gnostic
from aggregator.openapi.gnostic import encode_document, yaml_text

Fields = list[tuple[int, Any]]


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def fields(data: bytes) -> Fields:
    """One message level: (field number, int | float | bytes) in wire order."""
    out: Fields = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            out.append((number, value))
        elif wire == 1:
            out.append((number, struct.unpack("<d", data[i : i + 8])[0]))
            i += 8
        elif wire == 2:
            length, i = _varint(data, i)
            out.append((number, data[i : i + length]))
            i += length
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def one(data: bytes, number: int) -> Any:
    values = [v for n, v in fields(data) if n == number]
    assert len(values) == 1, f"field {number}: {len(values)} values in {fields(data)}"
    return values[0]


def every(data: bytes, number: int) -> list[Any]:
    return [v for n, v in fields(data) if n == number]


def named(data: bytes, number: int) -> dict[str, bytes]:
    """A `repeated Named<T>` field as {name: value bytes}, keeping order."""
    return {one(entry, 1).decode(): one(entry, 2) for entry in every(data, number)}


def any_value(data: bytes) -> Any:
    return yaml.safe_load(one(data, 2).decode())


def test_same_bytes_as_the_sample_servers_encoder_given_the_same_yaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sample's encoder is what kubectl 1.27/1.28 were proven against; only the YAML style differs."""
    doc = build_v2()
    monkeypatch.setattr(
        gnostic, "yaml_text", lambda value: yaml.safe_dump(value, default_flow_style=False, sort_keys=True)
    )
    assert encode_document(doc) == sample_encode_document(doc)


def test_yaml_of_any_values_reads_back_as_the_json_value() -> None:
    for value in [
        "get",
        "",
        [{"group": "", "kind": "Pod", "version": "v1"}],
        {"a": [1, 2.5, None, True]},
        0,
        "é: x",
    ]:
        assert yaml.safe_load(yaml_text(value)) == value


DOC: dict[str, Any] = {
    "swagger": "2.0",
    "info": {"title": "Kubernetes", "version": "v1.32.0", "x-info": "i"},
    "paths": {
        "x-paths-extension": True,
        "/api/v1/namespaces/{namespace}/pods": {
            "parameters": [
                {"$ref": "#/parameters/namespace-vxm"},
                {
                    "in": "query",
                    "name": "pretty",
                    "type": "string",
                    "uniqueItems": True,
                    "allowEmptyValue": True,
                },
            ],
            "get": {
                "consumes": ["*/*"],
                "produces": ["application/json", "application/yaml"],
                "schemes": ["https"],
                "tags": ["core_v1"],
                "operationId": "listCoreV1NamespacedPod",
                "parameters": [
                    {"in": "body", "name": "body", "required": True, "schema": {"$ref": "#/definitions/Pod"}},
                    {"in": "header", "name": "X-Thing", "type": "integer", "maximum": 5, "minimum": -3},
                ],
                "responses": {
                    "200": {"description": "OK", "schema": {"$ref": "#/definitions/PodList"}},
                    "401": {"description": "Unauthorized"},
                    "default": {"$ref": "#/responses/err"},
                    "x-codes": "c",
                },
                "x-kubernetes-action": "list",
                "x-kubernetes-group-version-kind": {"group": "", "kind": "Pod", "version": "v1"},
            },
        },
        "/download": {"get": {"responses": {"200": {"description": "a file", "schema": {"type": "file"}}}}},
    },
    "definitions": {
        "Pod": {
            "description": "Pod",
            "required": ["spec", "x-not-an-extension-here"],
            "type": "object",
            "properties": {
                "x-property-named-like-an-extension": {"type": "string"},
                "labels": {"additionalProperties": {"type": "string"}, "type": "object"},
                "closed": {"additionalProperties": False, "type": "object"},
                "ports": {
                    "items": {"$ref": "#/definitions/Port"},
                    "type": "array",
                    "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                    "x-kubernetes-list-type": "map",
                },
                "count": {"format": "int32", "maxLength": 10, "minItems": -1, "type": ["integer", "null"]},
                "mode": {"default": "Always", "enum": ["Always", "Never"], "type": "string"},
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
        },
    },
    "parameters": {"namespace-vxm": {"in": "path", "name": "namespace", "required": True, "type": "string"}},
    "securityDefinitions": {"BearerToken": {"in": "header", "name": "authorization", "type": "apiKey"}},
    "security": [{"BearerToken": []}],
}


def test_document_fields() -> None:
    pb = encode_document(DOC)
    assert one(pb, 1) == b"2.0"
    info = one(pb, 2)
    assert (one(info, 1), one(info, 2)) == (b"Kubernetes", b"v1.32.0")
    assert any_value(named(info, 7)["x-info"]) == "i"
    paths = one(pb, 8)
    assert list(named(paths, 1)) == ["x-paths-extension"]  # vendor_extension
    assert list(named(paths, 2)) == ["/api/v1/namespaces/{namespace}/pods", "/download"]
    security = one(pb, 12)
    assert named(security, 1) == {"BearerToken": b""}
    api_key = one(named(one(pb, 13), 1)["BearerToken"], 2)  # SecurityDefinitionsItem.api_key_security
    assert [one(api_key, n) for n in (1, 2, 3)] == [b"apiKey", b"authorization", b"header"]
    shared = named(one(pb, 10), 1)["namespace-vxm"]  # ParameterDefinitions
    path_param = one(one(shared, 2), 4)  # Parameter.non_body -> NonBodyParameter.path
    assert (one(path_param, 1), one(path_param, 2), one(path_param, 4), one(path_param, 5)) == (
        1,
        b"path",
        b"namespace",
        b"string",
    )


def test_path_items_operations_and_parameters() -> None:
    item = named(one(encode_document(DOC), 8), 2)["/api/v1/namespaces/{namespace}/pods"]
    ref, query = every(item, 9)
    assert one(one(ref, 2), 1) == b"#/parameters/namespace-vxm"  # ParametersItem.json_reference
    query = one(one(one(query, 1), 2), 3)  # parameter -> non_body -> query
    assert [n for n, _ in fields(query)] == [2, 4, 5, 6, 20]  # in, name, allowEmptyValue, type, uniqueItems
    get = one(item, 2)
    assert one(get, 5) == b"listCoreV1NamespacedPod"
    assert every(get, 6) == [b"application/json", b"application/yaml"] and every(get, 7) == [b"*/*"]
    assert every(get, 1) == [b"core_v1"] and every(get, 10) == [b"https"]
    body, header = every(get, 8)
    body = one(one(body, 1), 1)  # parameter -> body_parameter
    assert (one(body, 2), one(body, 3), one(body, 4)) == (b"body", b"body", 1)
    assert one(one(body, 5), 1) == b"#/definitions/Pod"
    header = one(one(one(header, 1), 2), 1)  # parameter -> non_body -> header
    assert one(header, 5) == b"integer" and one(header, 10) == 5.0 and one(header, 12) == -3.0
    responses = one(get, 9)
    codes = named(responses, 1)
    assert list(codes) == ["200", "401", "default"]
    assert one(one(one(one(codes["200"], 1), 2), 1), 1) == b"#/definitions/PodList"  # response.schema.schema
    assert one(one(codes["default"], 2), 1) == b"#/responses/err"
    assert list(named(responses, 2)) == ["x-codes"]
    extensions = named(get, 13)
    assert any_value(extensions["x-kubernetes-action"]) == "list"
    assert any_value(extensions["x-kubernetes-group-version-kind"]) == {
        "group": "",
        "kind": "Pod",
        "version": "v1",
    }
    download = one(named(one(encode_document(DOC), 8), 2)["/download"], 2)
    file_response = one(named(one(download, 9), 1)["200"], 1)
    assert one(one(one(file_response, 2), 2), 6) == b"file"  # SchemaItem.file_schema.type


def test_schemas() -> None:
    pod = named(one(encode_document(DOC), 9), 1)["Pod"]
    assert every(pod, 19) == [b"spec", b"x-not-an-extension-here"]
    assert one(one(pod, 22), 1) == b"object"
    properties = named(one(pod, 25), 1)
    assert list(properties) == [
        "x-property-named-like-an-extension",
        "labels",
        "closed",
        "ports",
        "count",
        "mode",
    ]
    labels = one(properties["labels"], 21)
    assert one(one(one(labels, 1), 22), 1) == b"string"  # additional_properties.schema.type
    assert fields(one(properties["closed"], 21)) == [(2, 0)]  # a oneof bool is written even when false
    ports = properties["ports"]
    assert one(one(one(ports, 23), 1), 1) == b"#/definitions/Port"  # items.schema[0].$ref
    assert any_value(named(ports, 31)["x-kubernetes-list-map-keys"]) == ["containerPort", "protocol"]
    count = properties["count"]
    assert every(one(count, 22), 1) == [b"integer", b"null"]
    assert one(count, 11) == 10 and one(count, 15) == (1 << 64) - 1  # int64 -1, two's complement
    mode = properties["mode"]
    assert any_value(one(mode, 5)) == "Always"
    assert [any_value(v) for v in every(mode, 20)] == ["Always", "Never"]
    assert any_value(named(pod, 31)["x-kubernetes-group-version-kind"]) == [
        {"group": "", "kind": "Pod", "version": "v1"}
    ]


def test_unknown_keys_and_wrong_types_are_ignored() -> None:
    pb = encode_document(
        {"swagger": "2.0", "nullable": True, "paths": {"/a": {"get": {"deprecated": "yes"}}}}
    )
    assert [n for n, _ in fields(pb)] == [1, 8]
    get = one(named(one(pb, 8), 2)["/a"], 2)
    assert get == b""
