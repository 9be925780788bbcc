"""v2 -> v3 for servers without /openapi/v3, checked against the sample server's own v3 documents."""

from __future__ import annotations

from typing import Any

from sample_apiserver.openapi import build_v2, build_v3

from aggregator.openapi.convert import convert_schema, convert_v2_to_v3, group_version_document

KEY = "apis/wardle.example.com/v1beta1"
FLUNDERS = "/apis/wardle.example.com/v1beta1/namespaces/{namespace}/flunders/{name}"


def test_a_group_version_of_the_samples_v2_converts_to_what_its_v3_says() -> None:
    converted = group_version_document(build_v2(), KEY)
    native = build_v3("v1beta1")
    assert converted is not None
    assert converted["openapi"] == "3.0.0" and list(converted) == ["openapi", "info", "paths", "components"]
    assert set(converted["paths"]) == set(native["paths"])  # only this group-version's paths
    assert set(converted["components"]["schemas"]) == set(native["components"]["schemas"])
    flunder = converted["components"]["schemas"]["com.example.wardle.v1beta1.Flunder"]
    expected = native["components"]["schemas"]["com.example.wardle.v1beta1.Flunder"]
    for name, prop in expected["properties"].items():
        # the $ref with a description beside it is wrapped in allOf, as kube-openapi's v3 has it
        assert flunder["properties"][name].get("allOf") == prop.get("allOf")
        assert flunder["properties"][name].get("description") == prop.get("description")
    assert flunder["x-kubernetes-group-version-kind"] == expected["x-kubernetes-group-version-kind"]

    patch = converted["paths"][FLUNDERS]["patch"]
    native_patch = native["paths"][FLUNDERS]["patch"]
    assert set(patch["requestBody"]["content"]) == set(native_patch["requestBody"]["content"])
    assert patch["requestBody"]["content"]["application/merge-patch+json"]["schema"] == {
        "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
    }
    names = [p["name"] for p in patch["parameters"]]
    assert "fieldValidation" in names  # what kubectl looks for to validate on the server
    assert patch["x-kubernetes-group-version-kind"] == native_patch["x-kubernetes-group-version-kind"]
    ok = patch["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/com.example.wardle.v1beta1.Flunder"
    }
    assert group_version_document(build_v2(), "apis/wardle.example.com/v9") is None


def test_parameters_responses_and_security() -> None:
    spec: dict[str, Any] = {
        "swagger": "2.0",
        "info": {"title": "t", "version": "1"},
        "produces": ["application/json"],
        "paths": {
            "/apis/g/v1/things": {
                "parameters": [{"$ref": "#/parameters/pretty"}],
                "get": {
                    "parameters": [
                        {
                            "in": "query",
                            "name": "names",
                            "type": "array",
                            "items": {"type": "string"},
                            "uniqueItems": True,
                        }
                    ],
                    "responses": {
                        "200": {"description": "OK", "schema": {"$ref": "#/definitions/T"}},
                        "default": {"$ref": "#/responses/err"},
                    },
                },
            }
        },
        "parameters": {"pretty": {"in": "query", "name": "pretty", "type": "string", "description": "p"}},
        "responses": {"err": {"description": "error"}},
        "securityDefinitions": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}},
        "definitions": {
            "T": {"type": "object", "properties": {"s": {"$ref": "#/definitions/S"}}},
            "S": {"type": "string"},
        },
    }
    v3 = convert_v2_to_v3(spec)
    item = v3["paths"]["/apis/g/v1/things"]
    assert item["parameters"] == [{"$ref": "#/components/parameters/pretty"}]
    get = item["get"]
    assert get["parameters"] == [
        {
            "name": "names",
            "in": "query",
            "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        }
    ]
    assert get["responses"]["200"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/T"}}
    }
    assert get["responses"]["default"] == {"$ref": "#/components/responses/err"}
    components = v3["components"]
    assert components["parameters"]["pretty"] == {
        "name": "pretty",
        "in": "query",
        "description": "p",
        "schema": {"type": "string"},
    }
    assert components["securitySchemes"] == {
        "BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}
    }
    assert components["schemas"]["T"]["properties"]["s"] == {
        "$ref": "#/components/schemas/S"
    }  # no siblings: no allOf


def test_convert_schema_recurses_into_every_subschema() -> None:
    schema = {
        "items": {"$ref": "#/definitions/A"},
        "additionalProperties": {"$ref": "#/definitions/B", "description": "b"},
        "allOf": [{"$ref": "#/definitions/C"}],
        "not": {"$ref": "#/definitions/D"},
    }
    assert convert_schema(schema) == {
        "items": {"$ref": "#/components/schemas/A"},
        "additionalProperties": {"description": "b", "allOf": [{"$ref": "#/components/schemas/B"}]},
        "allOf": [{"$ref": "#/components/schemas/C"}],
        "not": {"$ref": "#/components/schemas/D"},
    }
