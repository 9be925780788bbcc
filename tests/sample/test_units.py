"""Pure pieces: selectors, patches, Accept negotiation, conversion and request info."""

from __future__ import annotations

import pytest
from sample_apiserver.api import FLUNDERS
from sample_apiserver.negotiation import negotiate, parse_accept
from sample_apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from sample_apiserver.selectors import object_predicate, supported_fields

from aggregator.model.selectors import FieldRequirement, SelectorError, parse_label_selector


def test_label_selector_parsing() -> None:
    reqs = parse_label_selector("a=1,b!=2, c in (x, y),d notin (z),e,!f")
    assert [(r.key, r.operator, r.values) for r in reqs] == [
        ("a", "=", ("1",)),
        ("b", "!=", ("2",)),
        ("c", "in", ("x", "y")),
        ("d", "notin", ("z",)),
        ("e", "exists", ()),
        ("f", "!", ()),
    ]
    assert parse_label_selector("") == ()
    # upstream's parseValues reads `()` as the set {""}
    assert [(r.key, r.operator, r.values) for r in parse_label_selector("a in ()")] == [("a", "in", ("",))]
    with pytest.raises(SelectorError):
        parse_label_selector("a==b==c")


def test_field_selector_parsing() -> None:
    assert supported_fields("metadata.name==x,metadata.namespace!=y") == (
        FieldRequirement("metadata.name", "=", "x"),
        FieldRequirement("metadata.namespace", "!=", "y"),
    )
    with pytest.raises(SelectorError, match="not a known field selector"):
        supported_fields("status.phase=Running")


def test_object_predicate() -> None:
    obj: dict[str, object] = {
        "metadata": {"name": "a", "namespace": "ns", "labels": {"tier": "web", "n": "5"}}
    }
    assert object_predicate("tier=web,n>3", "metadata.name=a")(obj)
    assert not object_predicate("tier in (db)", "")(obj)
    assert object_predicate("missing!=x,!other", "metadata.namespace!=kube-system")(obj)
    assert not object_predicate("", "metadata.name!=a")(obj)


def test_merge_and_strategic_patches() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert strategic_merge_patch(target, {"a": {"$patch": "replace", "x": 1}}) == {"a": {"x": 1}, "l": [1, 2]}
    assert strategic_merge_patch(target, {"a": {"$patch": "delete"}}) == {"l": [1, 2]}
    assert strategic_merge_patch(target, {"$setElementOrder/l": [1], "a": {"b": 5}})["a"] == {"b": 5, "c": 2}
    with pytest.raises(PatchError):
        strategic_merge_patch(target, {"$patch": "explode"})


def test_json_patch_operations_and_errors() -> None:
    doc = {"a": {"b": [1, 2]}, "c": "x"}
    patched = json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "remove", "path": "/c"},
            {"op": "copy", "from": "/a/b", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e"},
            {"op": "replace", "path": "/a/b/1", "value": 9},
            {"op": "test", "path": "/e/3", "value": 3},
            {"op": "add", "path": "/k~1v", "value": True},
        ],
    )
    assert patched == {"a": {"b": [0, 9, 2, 3]}, "e": [0, 1, 2, 3], "k/v": True}
    assert doc == {"a": {"b": [1, 2]}, "c": "x"}  # the input is not modified
    # evanphx/json-patch's words (what kube-apiserver answers), never the document itself.
    for ops, message in (
        ([{"op": "remove", "path": "/nope"}], "unable to remove nonexistent key: nope: missing value"),
        ([{"op": "replace", "path": "/a/x", "value": 1}], 'doc is missing path: "/a/x": missing value'),
        ([{"op": "add", "path": "/a/b/7", "value": 1}], 'doc is missing path: "/a/b/7": missing value'),
        ([{"op": "add", "path": "/z/y", "value": 1}], 'doc is missing path: "/z/y": missing value'),
        ([{"op": "move", "from": "/q", "path": "/r"}], 'doc is missing path: "/q": missing value'),
        ([{"op": "copy", "path": "/r"}], "copy operation missing from field"),
        ([{"op": "test", "path": "/c", "value": "y"}], "testing value /c failed: test failed"),
        ([{"op": "frobnicate", "path": "/a"}], "Unexpected kind: frobnicate"),
    ):
        with pytest.raises(PatchError) as failed:
            json_patch(doc, ops)
        assert (str(failed.value), failed.value.code) == (message, 422)
    assert doc == {"a": {"b": [1, 2]}, "c": "x"}
    with pytest.raises(PatchError) as err:
        json_patch(doc, {"op": "add"})
    assert err.value.code == 400


def test_accept_parsing_follows_goautoneg() -> None:
    clauses = parse_accept("text/*, application/json;q=0.9, */*;q=0.1")
    assert [f"{c.type}/{c.subtype}" for c in clauses] == [
        "application/json",
        "text/*",
        "*/*",
    ]  # goautoneg quirk
    assert parse_accept("application/json;q=0.9")[0].q == pytest.approx(0.9, abs=1e-6)
    table = frozenset({("meta.k8s.io", "v1", "Table")})
    chosen = negotiate(
        "application/json;as=Table;v=v1;g=meta.k8s.io, application/json", ("application/json",), table
    )
    assert chosen is not None and chosen.convert == ("meta.k8s.io", "v1", "Table")
    chosen = negotiate(
        "application/json;as=Table;v=v2;g=meta.k8s.io, application/json", ("application/json",), table
    )
    assert chosen is not None and chosen.convert is None
    assert negotiate("application/json;stream=other", ("application/json",)) is None
    assert negotiate("", ("application/json",)) is not None
    chosen = negotiate("*/*", ("application/json", "application/yaml"))
    assert chosen is not None and chosen.media_type == "application/json"


def test_conversion_drops_unknown_reference_types_like_upstream() -> None:
    internal = FLUNDERS.from_version(
        {"metadata": {}, "spec": {"reference": "x", "referenceType": "Other"}}, "v1alpha1"
    )
    assert internal["spec"] == {}
    internal = FLUNDERS.from_version({"metadata": {}, "spec": {"reference": "x"}}, "v1alpha1")
    assert internal["spec"] == {"referenceType": "Flunder", "flunderReference": "x"}
    assert FLUNDERS.to_version(internal, "v1beta1")["spec"] == {
        "flunderReference": "x",
        "referenceType": "Flunder",
    }
