"""The gnostic protobuf encoding of OpenAPI v2, read back with gnostic's own message classes.

`tests/support/gnostic.py` builds `openapi.v2.*` from gnostic's OpenAPIv2.proto: a field written
under a wrong number or wire type is an unknown field there, and a value under the wrong name
reads back wrong. Bytes must also be exactly what a protobuf serializer writes for the message
(fields in number order, zero values left out, as Go's `proto.Marshal` does).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from google.protobuf.message import Message

from aggregator.openapi.gnostic import encode_document, yaml_text
from tests.support.gnostic import gnostic_classes, unknown_fields

Classes = dict[str, type[Message]]


@pytest.fixture(scope="module")
def openapi_v2() -> Classes:
    return gnostic_classes()


def decode(classes: Classes, doc: dict[str, Any]) -> Any:
    """`encode_document(doc)` as gnostic's Document, checked field by field against its schema."""
    encoded = encode_document(doc)
    message = classes["Document"].FromString(encoded)
    assert list(unknown_fields(message)) == []
    assert message.SerializeToString(deterministic=True) == encoded
    return message


def named(entries: Any) -> dict[str, Any]:
    """A `repeated Named<T>` as {name: value}, keeping order."""
    return {entry.name: entry.value for entry in entries}


def any_value(value: Any) -> Any:
    return yaml.safe_load(value.yaml)


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
                    {"in": "formData", "name": "f", "type": "file", "collectionFormat": "csv"},
                ],
                "responses": {
                    "200": {"description": "OK", "schema": {"$ref": "#/definitions/PodList"}},
                    "401": {
                        "description": "Unauthorized",
                        "headers": {"Retry-After": {"type": "integer", "description": "s"}},
                        "examples": {"application/json": {"kind": "Status"}},
                    },
                    "default": {"$ref": "#/responses/err"},
                    "x-codes": "c",
                },
                "security": [{"oauth": ["read"]}],
                "deprecated": True,
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
                "ratio": {"multipleOf": 0.5, "maximum": 2, "exclusiveMaximum": True, "readOnly": True},
                "doc": {"xml": {"name": "d", "wrapped": True}, "externalDocs": {"url": "https://x"}},
                "mixed": {"allOf": [{"$ref": "#/definitions/A"}, {"$ref": "#/definitions/B"}]},
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
        },
    },
    "parameters": {"namespace-vxm": {"in": "path", "name": "namespace", "required": True, "type": "string"}},
    "responses": {"err": {"description": "an error"}},
    "securityDefinitions": {
        "BearerToken": {"in": "header", "name": "authorization", "type": "apiKey"},
        "basic": {"type": "basic"},
        "oauth": {
            "type": "oauth2",
            "flow": "accessCode",
            "authorizationUrl": "https://a",
            "tokenUrl": "https://t",
            "scopes": {"read": "reads"},
        },
        "implicit": {"type": "oauth2", "flow": "implicit", "authorizationUrl": "https://a"},
        "password": {"type": "oauth2", "flow": "password", "tokenUrl": "https://t"},
    },
    "security": [{"BearerToken": []}],
    "tags": [{"name": "core_v1", "description": "core"}],
    "externalDocs": {"description": "more"},
    "x-top": 1,
}


def test_document_fields(openapi_v2: Classes) -> None:
    doc = decode(openapi_v2, DOC)
    assert doc.swagger == "2.0"
    assert (doc.info.title, doc.info.version) == ("Kubernetes", "v1.32.0")
    assert any_value(named(doc.info.vendor_extension)["x-info"]) == "i"
    assert list(named(doc.paths.vendor_extension)) == ["x-paths-extension"]
    assert list(named(doc.paths.path)) == ["/api/v1/namespaces/{namespace}/pods", "/download"]
    assert [list(named(r.additional_properties)) for r in doc.security] == [["BearerToken"]]
    schemes = named(doc.security_definitions.additional_properties)
    api_key = schemes["BearerToken"].api_key_security
    assert (api_key.type, api_key.name, getattr(api_key, "in")) == ("apiKey", "authorization", "header")
    assert schemes["basic"].WhichOneof("oneof") == "basic_authentication_security"
    access_code = schemes["oauth"].oauth2_access_code_security
    assert (access_code.authorization_url, access_code.token_url) == ("https://a", "https://t")
    assert named(access_code.scopes.additional_properties) == {"read": "reads"}
    assert schemes["implicit"].oauth2_implicit_security.authorization_url == "https://a"
    assert schemes["password"].oauth2_password_security.token_url == "https://t"
    shared = named(doc.parameters.additional_properties)["namespace-vxm"]
    path_param = shared.non_body_parameter.path_parameter_sub_schema
    assert (path_param.required, getattr(path_param, "in"), path_param.name, path_param.type) == (
        True,
        "path",
        "namespace",
        "string",
    )
    assert named(doc.responses.additional_properties)["err"].description == "an error"
    assert [(t.name, t.description) for t in doc.tags] == [("core_v1", "core")]
    assert doc.external_docs.description == "more"
    assert any_value(named(doc.vendor_extension)["x-top"]) == 1


def test_path_items_operations_and_parameters(openapi_v2: Classes) -> None:
    paths = named(decode(openapi_v2, DOC).paths.path)
    item = paths["/api/v1/namespaces/{namespace}/pods"]
    ref, query = item.parameters
    assert ref.json_reference._ref == "#/parameters/namespace-vxm"
    query = query.parameter.non_body_parameter.query_parameter_sub_schema
    assert (query.name, query.type, query.allow_empty_value, query.unique_items) == ("pretty", "string", True, True)
    get = item.get
    assert get.operation_id == "listCoreV1NamespacedPod"
    assert list(get.produces) == ["application/json", "application/yaml"] and list(get.consumes) == ["*/*"]
    assert list(get.tags) == ["core_v1"] and list(get.schemes) == ["https"] and get.deprecated
    body, header, form = get.parameters
    body = body.parameter.body_parameter
    assert (body.name, getattr(body, "in"), body.required) == ("body", "body", True)
    assert body.schema._ref == "#/definitions/Pod"
    header = header.parameter.non_body_parameter.header_parameter_sub_schema
    assert (header.type, header.maximum, header.minimum) == ("integer", 5.0, -3.0)
    form = form.parameter.non_body_parameter.form_data_parameter_sub_schema
    assert (form.type, form.collection_format) == ("file", "csv")
    codes = named(get.responses.response_code)
    assert list(codes) == ["200", "401", "default"]
    assert codes["200"].response.schema.schema._ref == "#/definitions/PodList"
    unauthorized = codes["401"].response
    assert named(unauthorized.headers.additional_properties)["Retry-After"].description == "s"
    assert any_value(named(unauthorized.examples.additional_properties)["application/json"]) == {"kind": "Status"}
    assert codes["default"].json_reference._ref == "#/responses/err"
    assert list(named(get.responses.vendor_extension)) == ["x-codes"]
    assert [list(named(s.additional_properties)["oauth"].value) for s in get.security] == [["read"]]
    extensions = named(get.vendor_extension)
    assert any_value(extensions["x-kubernetes-action"]) == "list"
    assert any_value(extensions["x-kubernetes-group-version-kind"]) == {"group": "", "kind": "Pod", "version": "v1"}
    download = named(paths["/download"].get.responses.response_code)["200"].response
    assert download.schema.file_schema.type == "file"


def test_schemas(openapi_v2: Classes) -> None:
    pod = named(decode(openapi_v2, DOC).definitions.additional_properties)["Pod"]
    assert list(pod.required) == ["spec", "x-not-an-extension-here"]
    assert list(pod.type.value) == ["object"]
    properties = named(pod.properties.additional_properties)
    assert list(properties) == [
        "x-property-named-like-an-extension",
        "labels",
        "closed",
        "ports",
        "count",
        "mode",
        "ratio",
        "doc",
        "mixed",
    ]
    assert list(properties["labels"].additional_properties.schema.type.value) == ["string"]
    closed = properties["closed"].additional_properties
    assert closed.WhichOneof("oneof") == "boolean" and closed.boolean is False  # written even when false
    ports = properties["ports"]
    assert [s._ref for s in ports.items.schema] == ["#/definitions/Port"]
    assert any_value(named(ports.vendor_extension)["x-kubernetes-list-map-keys"]) == ["containerPort", "protocol"]
    count = properties["count"]
    assert list(count.type.value) == ["integer", "null"]
    assert (count.format, count.max_length, count.min_items) == ("int32", 10, -1)
    mode = properties["mode"]
    assert any_value(mode.default) == "Always"
    assert [any_value(v) for v in mode.enum] == ["Always", "Never"]
    ratio = properties["ratio"]
    assert (ratio.multiple_of, ratio.maximum, ratio.exclusive_maximum, ratio.read_only) == (0.5, 2.0, True, True)
    doc = properties["doc"]
    assert (doc.xml.name, doc.xml.wrapped, doc.external_docs.url) == ("d", True, "https://x")
    assert [s._ref for s in properties["mixed"].all_of] == ["#/definitions/A", "#/definitions/B"]
    assert any_value(named(pod.vendor_extension)["x-kubernetes-group-version-kind"]) == [
        {"group": "", "kind": "Pod", "version": "v1"}
    ]


def test_unknown_keys_and_wrong_types_are_ignored(openapi_v2: Classes) -> None:
    doc = decode(openapi_v2, {"swagger": "2.0", "nullable": True, "paths": {"/a": {"get": {"deprecated": "yes"}}}})
    assert [field.name for field, _ in doc.ListFields()] == ["swagger", "paths"]
    get = named(doc.paths.path)["/a"].get
    assert get.ByteSize() == 0 and doc.paths.path[0].value.HasField("get")
