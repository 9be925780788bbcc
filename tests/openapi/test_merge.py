"""The v2 merge against kube-openapi's own aggregator test cases, plus what the gateway adds.

The `upstream_*` cases are kube-openapi's `pkg/aggregator/aggregator_test.go` (FilterSpecs,
MergeSpecs*, TwoMergeSpecs*), with the documents transcribed to YAML as upstream writes them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.openapi.component import merge_order
from aggregator.openapi.merge import (
    GVK_KEY,
    filter_paths,
    keep_prefixes,
    merge_documents,
    merge_into,
    replace_refs,
    used_references,
)

JSON = dict[str, Any]


def doc(text: str) -> JSON:
    loaded: JSON = yaml.safe_load(text)
    # YAML reads `405:` as an int; in JSON every key is a string.
    stringified: JSON = json.loads(json.dumps(loaded))
    return stringified


def merged(dest: JSON, *sources: JSON) -> JSON:
    """`MergeSpecs(dest, source)` for each source, on a copy of dest (merge_into owns its dicts)."""
    out = copy.deepcopy(dest)
    for source in sources:
        merge_into(out, source)
    return out


TEST_OP = """
    post:
      tags: ["test"]
      summary: "Test API"
      operationId: "addTest"
      parameters:
      - in: "body"
        name: "body"
        description: "test object"
        required: true
        schema:
          $ref: "#/definitions/Test"
      responses:
        405:
          description: "Invalid input"
          $ref: "#/definitions/InvalidInput"
"""
OTHER_OP = """
    post:
      tags: ["test2"]
      summary: "Test2 API"
      operationId: "addTest2"
      consumes: ["application/json"]
      produces: ["application/xml"]
      parameters:
      - in: "body"
        name: "body"
        description: "test2 object"
        required: true
        schema:
          $ref: "#/definitions/Test2"
"""
TEST_DEFS = """
  Test:
    type: "object"
    properties:
      id: {type: "integer", format: "int64"}
      status: {type: "string", description: "Status"}
  InvalidInput:
    type: "string"
    format: "string"
"""
TEST2_DEFS = """
  Test2:
    type: "object"
    properties:
      other:
        $ref: "#/definitions/Other"
  Other:
    type: "string"
"""


def test_upstream_filter_specs_keeps_never_used_definitions() -> None:
    spec = doc(
        f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}  /othertest:{OTHER_OP}definitions:{TEST_DEFS}{TEST2_DEFS}'
        '  Unused:\n    type: "object"\n'
    )
    before = copy.deepcopy(spec)
    filtered = filter_paths(spec, keep_prefixes(["/test"]))
    expected = doc(
        f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}definitions:{TEST_DEFS}  Unused:\n    type: "object"\n'
    )
    assert filtered == expected
    assert spec == before  # WithoutSideEffects


def test_upstream_merge_specs_simple() -> None:
    spec1 = doc(f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}definitions:{TEST_DEFS}')
    spec2 = doc(f'swagger: "2.0"\npaths:\n  /othertest:{OTHER_OP}definitions:{TEST2_DEFS}')
    expected = doc(
        f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}  /othertest:{OTHER_OP}definitions:{TEST_DEFS}{TEST2_DEFS}'
    )
    assert merged(spec1, spec2) == expected


def test_upstream_merge_specs_empty_definitions_and_empty_paths() -> None:
    no_defs = doc(f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}')
    spec2 = doc(f'swagger: "2.0"\npaths:\n  /othertest:{OTHER_OP}definitions:{TEST2_DEFS}')
    assert merged(no_defs, spec2) == doc(
        f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}  /othertest:{OTHER_OP}definitions:{TEST2_DEFS}'
    )
    no_paths = doc(f'swagger: "2.0"\ndefinitions:{TEST_DEFS}')
    assert merged(no_paths, spec2) == doc(
        f'swagger: "2.0"\npaths:\n  /othertest:{OTHER_OP}definitions:{TEST_DEFS}{TEST2_DEFS}'
    )


def test_upstream_reuse_model() -> None:
    spec1 = doc(f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}definitions:{TEST_DEFS}')
    other_uses_test = OTHER_OP.replace("Test2", "Test")
    spec2 = doc(f'swagger: "2.0"\npaths:\n  /othertest:{other_uses_test}definitions:{TEST_DEFS}')
    assert merged(spec1, spec2) == doc(
        f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}  /othertest:{other_uses_test}definitions:{TEST_DEFS}'
    )


def test_upstream_rename_model() -> None:
    spec1 = doc(f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}definitions:{TEST_DEFS}')
    other_uses_test = OTHER_OP.replace("Test2", "Test")
    spec2 = doc(
        f'swagger: "2.0"\npaths:\n  /othertest:{other_uses_test}definitions:\n'
        '  Test:\n    description: "This Test has a description"\n    type: "object"\n'
        '    properties:\n      id: {type: "integer", format: "int64"}\n'
        '  InvalidInput:\n    type: "string"\n    format: "string"\n'
    )
    result = merged(spec1, spec2)
    assert result["paths"]["/othertest"]["post"]["parameters"][0]["schema"] == {
        "$ref": "#/definitions/Test_v2"
    }
    assert result["paths"]["/test"]["post"]["parameters"][0]["schema"] == {"$ref": "#/definitions/Test"}
    assert result["definitions"]["Test_v2"]["description"] == "This Test has a description"
    assert "status" in result["definitions"]["Test"]["properties"]
    assert set(result["definitions"]) == {"Test", "Test_v2", "InvalidInput"}


def _ref_op(name: str) -> str:
    return f'\n    post:\n      parameters:\n      - name: "body"\n        schema:\n          $ref: "#/definitions/{name}"\n'


def test_upstream_rename_model_with_existing_v2_in_destination_and_in_source() -> None:
    dest = doc(
        f'swagger: "2.0"\npaths:\n  /test:{_ref_op("Test")}  /testv2:{_ref_op("Test_v2")}definitions:\n'
        '  Test: {type: "object"}\n  Test_v2: {description: "existing Test_v2 in destination", type: "object"}\n'
    )
    source = doc(
        f'swagger: "2.0"\npaths:\n  /othertest:{_ref_op("Test")}definitions:\n'
        '  Test: {description: "This Test has a description", type: "object"}\n'
    )
    result = merged(dest, source)
    assert result["paths"]["/othertest"]["post"]["parameters"][0]["schema"]["$ref"] == "#/definitions/Test_v3"
    assert result["definitions"]["Test_v3"] == {
        "description": "This Test has a description",
        "type": "object",
    }

    dest = doc(f'swagger: "2.0"\npaths:\n  /test:{_ref_op("Test")}definitions:\n  Test: {{type: "object"}}\n')
    source = doc(
        f'swagger: "2.0"\npaths:\n  /othertest:{_ref_op("Test")}  /testv2:{_ref_op("Test_v2")}definitions:\n'
        '  Test: {description: "This Test has a description", type: "object"}\n'
        '  Test_v2: {description: "existing Test_v2 in source", type: "object"}\n'
    )
    result = merged(dest, source)
    refs = {p: item["post"]["parameters"][0]["schema"]["$ref"] for p, item in result["paths"].items()}
    assert refs == {
        "/test": "#/definitions/Test",
        "/othertest": "#/definitions/Test_v3",
        "/testv2": "#/definitions/Test_v2",
    }
    assert result["definitions"]["Test_v2"]["description"] == "existing Test_v2 in source"


@pytest.mark.parametrize("same", ["first-two", "last-two"])
def test_upstream_three_specs_two_sharing_a_definition(same: str) -> None:
    a = {"description": "shared", "type": "object"}
    b = {"description": "its own", "type": "object"}
    bodies = [a, a, b] if same == "first-two" else [b, a, a]
    specs = [
        {"swagger": "2.0", "paths": yaml.safe_load(f"/p{i}:{_ref_op('Test')}"), "definitions": {"Test": body}}
        for i, body in enumerate(bodies)
    ]
    result = merged(specs[0], specs[1], specs[2])
    assert set(result["definitions"]) == {"Test", "Test_v2"}  # two versions, not three
    refs = [result["paths"][f"/p{i}"]["post"]["parameters"][0]["schema"]["$ref"] for i in range(3)]
    if same == "first-two":
        assert refs == ["#/definitions/Test", "#/definitions/Test", "#/definitions/Test_v2"]
    else:
        assert refs == ["#/definitions/Test", "#/definitions/Test_v2", "#/definitions/Test_v2"]


# --- beyond upstream's test file ------------------------------------------------------------------


def test_first_document_wins_conflicting_paths_and_their_definitions_stay_out() -> None:
    first = doc(f'swagger: "2.0"\npaths:\n  /test:{TEST_OP}definitions:{TEST_DEFS}')
    second = doc(
        f'swagger: "2.0"\npaths:\n  /test:{_ref_op("Other")}  /othertest:{OTHER_OP}definitions:{TEST2_DEFS}'
        '  OnlyForConflict: {type: "string"}\n'
    )
    second["paths"]["/test"]["post"]["parameters"][0]["schema"] = {"$ref": "#/definitions/OnlyForConflict"}
    result = merged(first, second)
    assert result["paths"]["/test"] == first["paths"]["/test"]
    assert "/othertest" in result["paths"]
    assert "OnlyForConflict" not in result["definitions"]
    assert {"Test2", "Other"} <= set(result["definitions"])
    # every path conflicting: nothing of the document is taken
    assert merged(
        first, doc(f'swagger: "2.0"\npaths:\n  /test:{_ref_op("X")}definitions:\n  X: {{}}\n')
    ) == merged(first)


def test_definitions_differing_only_in_gvk_merge_their_gvk_lists_sorted() -> None:
    def spec(path: str, gvks: list[dict[str, str]]) -> JSON:
        return {
            "paths": yaml.safe_load(f"{path}:{_ref_op('io.k8s.meta.v1.DeleteOptions')}"),
            "definitions": {"io.k8s.meta.v1.DeleteOptions": {"type": "object", GVK_KEY: gvks}},
        }

    first = spec("/apis/b/v1/x", [{"group": "b", "kind": "DeleteOptions", "version": "v1"}])
    second = spec("/apis/a/v1/x", [{"group": "a", "kind": "DeleteOptions", "version": "v1"}])
    before = copy.deepcopy(first)
    result = merged(first, second)
    assert set(result["definitions"]) == {"io.k8s.meta.v1.DeleteOptions"}
    assert [g["group"] for g in result["definitions"]["io.k8s.meta.v1.DeleteOptions"][GVK_KEY]] == ["a", "b"]
    assert first == before  # the merged list is a new value, not written into the input


def test_shared_parameters_are_merged_and_renamed_on_conflict() -> None:
    def spec(path: str, body: JSON) -> JSON:
        return {
            "paths": {path: {"get": {"parameters": [{"$ref": "#/parameters/pretty-abc"}]}}},
            "parameters": {"pretty-abc": body},
        }

    query = {"in": "query", "name": "pretty", "type": "string"}
    other = {**query, "description": "different"}
    result = merged(spec("/a", query), spec("/b", query), spec("/c", other))
    assert result["parameters"] == {"pretty-abc": query, "pretty-abc_v2": other}
    assert result["paths"]["/b"]["get"]["parameters"] == [{"$ref": "#/parameters/pretty-abc"}]
    assert result["paths"]["/c"]["get"]["parameters"] == [{"$ref": "#/parameters/pretty-abc_v2"}]


def test_definitions_reached_through_shared_parameters_count_as_used() -> None:
    spec = {
        "paths": {
            "/keep": {"delete": {"parameters": [{"$ref": "#/parameters/body"}]}},
            "/drop": {"get": {"responses": {"200": {"schema": {"$ref": "#/definitions/Dropped"}}}}},
        },
        "parameters": {
            "body": {"in": "body", "name": "body", "schema": {"$ref": "#/definitions/DeleteOptions"}}
        },
        "definitions": {"DeleteOptions": {"type": "object"}, "Dropped": {"type": "object"}},
    }
    assert used_references(spec) == ({"DeleteOptions", "Dropped"}, {"body"})
    filtered = filter_paths(spec, keep_prefixes(["/keep"]))
    assert set(filtered["definitions"]) == {"DeleteOptions"}
    assert set(filtered["parameters"]) == {"body"}


def test_replace_refs_copies_only_what_changes() -> None:
    untouched = {"type": "string"}
    node = {"a": {"$ref": "#/definitions/X"}, "b": untouched, "c": [untouched, {"$ref": "#/definitions/Y"}]}
    out = replace_refs(node, {"#/definitions/X": "#/definitions/X_v2"})
    assert out["a"] == {"$ref": "#/definitions/X_v2"} and node["a"] == {"$ref": "#/definitions/X"}
    assert out["b"] is untouched and out["c"] is node["c"]
    assert replace_refs(node, {}) is node
    # a property literally named "$ref" (JSONSchemaProps has one) is a schema, not a reference
    props = {"properties": {"$ref": {"type": "string"}}}
    assert replace_refs(props, {"#/definitions/X": "y"}) is props


def test_merge_documents_keeps_the_first_metadata_sorts_and_skips_a_broken_document() -> None:
    gvk = [{"group": "g", "kind": "A", "version": "v1"}]
    head = {"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": {}}
    good = {
        "swagger": "2.0",
        "info": {"title": "Wardle"},
        "paths": {"/z": {"get": {"parameters": [{"$ref": "#/definitions/A"}]}}, "/a": {}},
        "definitions": {"B": {}, "A": {GVK_KEY: gvk}},
    }

    def using_a(path: str, body: JSON) -> JSON:
        return {
            "paths": {path: {"get": {"parameters": [{"$ref": "#/definitions/A"}]}}},
            "definitions": {"A": body},
        }

    broken = using_a("/m", {GVK_KEY: "not a list"})  # equal modulo GVK, but the GVKs cannot merge
    renamed = using_a("/n", {"x": 1})
    result = merge_documents([("head", head), ("wardle", good), ("broken", broken), ("renamed", renamed)])
    document = result.document
    assert list(document) == ["swagger", "info", "paths", "definitions"]
    assert document["info"] == {"title": "Kubernetes", "version": "v1.32.0"}
    assert list(document["paths"]) == ["/a", "/n", "/z"]
    assert list(document["definitions"]) == ["A", "A_v2", "B"]
    assert document["paths"]["/n"]["get"]["parameters"] == [{"$ref": "#/definitions/A_v2"}]
    assert [name for name, _ in result.skipped] == ["broken"]
    assert "expected slice of GroupVersionKinds" in result.skipped[0][1]
    assert list(good["paths"]) == ["/z", "/a"]  # inputs untouched


def _svc(name: str, gpm: int, vp: int) -> APIService:
    version, _, group = name.partition(".")
    return APIService(name, group, version, ServiceReference("ns", "svc"), gpm, vp)


def test_merge_order_uses_version_priority_inside_a_group() -> None:
    services = [
        _svc("v1alpha1.wardle.example.com", 1000, 9),
        _svc("v1beta1.wardle.example.com", 100, 15),  # the group's priority is its highest GPM
        _svc("v1beta1.metrics.k8s.io", 100, 100),
        _svc("v1.zeta.example.com", 1000, 15),
        _svc("v2.zeta.example.com", 1000, 20),
        APIService("v1.apps", "apps", "v1", None, 17800, 15),  # local: not merged from a backend
    ]
    assert [s.name for s in merge_order(services)] == [
        "v1beta1.wardle.example.com",  # upstream: v1alpha1 first (names compared, its VP bug)
        "v1alpha1.wardle.example.com",
        "v2.zeta.example.com",
        "v1.zeta.example.com",
        "v1beta1.metrics.k8s.io",
    ]
