"""Accept parsing and negotiation: goautoneg's and apiserver's quirks, one row each."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.wire.gosort import go_sort
from aggregator.wire.negotiation import (
    GVK,
    JSON,
    YAML,
    Negotiator,
    default_restriction,
    discovery_restriction,
    negotiate,
    parse_accept,
    parse_float32,
)

V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
V2_YAML = "application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
V2_PROTO = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
# What client-go >= 1.33 sends for discovery.
KUBECTL = f"{V2_PROTO},{V2},application/vnd.kubernetes.protobuf,application/json"


def clauses(header: str) -> list[tuple[str, str, float]]:
    return [(c.type, c.subtype, c.q) for c in parse_accept(header)]


def test_parse_basic_shapes() -> None:
    assert clauses("application/json") == [("application", "json", 1.0)]
    assert clauses("*") == [("*", "*", 1.0)]  # bare * means */*
    assert clauses("application, a/b/c, text/plain") == [("text", "plain", 1.0)]  # malformed ranges dropped
    assert clauses("  application/json  ") == [("application", "json", 1.0)]
    assert clauses("\tapplication/json") == [("\tapplication", "json", 1.0)]  # only ASCII spaces are trimmed
    assert clauses("") == []


def test_params_and_q() -> None:
    (clause,) = parse_accept("application/json; g = x ;v=v2=extra;broken;q=0.5")
    assert clause.params == {"g": "x", "v": "v2=extra"}
    assert clause.q == 0.5
    assert parse_accept("a/b;q=0.9")[0].q == 0.8999999761581421  # float32
    assert parse_accept("a/b;q= 0.5")[0].q == 0.0  # the value is not trimmed: a syntax error, so 0
    assert parse_accept("a/b;q=abc")[0].q == 0.0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1.0),
        ("0.001", 0.0010000000474974513),
        (".5", 0.5),
        ("5.", 5.0),
        ("1e-1", 0.10000000149011612),
        ("1e39", math.inf),
        ("-1e39", -math.inf),
        ("Inf", math.inf),
        ("-infinity", -math.inf),
        ("0x1p-2", 0.25),
        ("1_0", 0.0),
        ("", 0.0),
        (" 1", 0.0),
        ("0x1p99999", math.inf),
    ],
)
def test_parse_float32(text: str, value: float) -> None:
    assert parse_float32(text) == value
    assert math.isnan(parse_float32("NaN"))


def test_non_strict_less_quirk() -> None:
    # Less(json;q=0.9, text/*) is true (subtype * rule) and Less(text/*, json) is true too (q rule):
    # insertion sort leaves JSON first.
    assert clauses("text/*, application/json;q=0.9") == [
        ("application", "json", 0.8999999761581421),
        ("text", "*", 1.0),
    ]
    assert clauses("*/*, application/json") == [("application", "json", 1.0), ("*", "*", 1.0)]
    assert clauses("a/b;q=0.1, c/d;q=0.5, e/f") == [
        ("e", "f", 1.0),
        ("c", "d", 0.5),
        ("a", "b", 0.10000000149011612),
    ]


@pytest.mark.parametrize(
    ("accept", "media_type", "convert"),
    [
        ("", JSON, None),
        ("application/json", JSON, None),
        ("application/yaml", YAML, None),
        ("*/*", JSON, None),
        ("application/*", JSON, None),
        ("*", JSON, None),
        ("application/vnd.kubernetes.protobuf, application/json", JSON, None),  # protobuf not served
        ("application/vnd.kubernetes.protobuf", None, None),
        ("text/html", None, None),
        ("Application/JSON", None, None),  # case-sensitive
        ("application/json;q=0", JSON, None),  # q=0 still matches in k8s
        ("application/yaml;q=0.5, application/json;q=0.9", JSON, None),
        ("application/json;as=Table;v=v1;g=meta.k8s.io", None, None),  # conversions refused
        ("application/json;as=Table;v=v1;g=meta.k8s.io, application/yaml", YAML, None),
        ("application/json;sv=v1", None, None),
        ("application/json;stream=watch", JSON, None),
        ("application/yaml;stream=watch", None, None),  # YAML has no stream serializer
        ("application/json;stream=foo", None, None),
        (V2, None, None),
        (KUBECTL, JSON, None),
    ],
)
def test_legacy_negotiation(accept: str, media_type: str | None, convert: GVK | None) -> None:
    result = Negotiator(default_restriction)(accept)
    if media_type is None:
        assert result is None
    else:
        assert result is not None and result.media_type == media_type and result.convert == convert


@pytest.mark.parametrize(
    ("accept", "media_type", "version"),
    [
        ("", None, None),
        ("application/json", None, None),  # plain clauses are skipped in the aggregated pass
        (f"application/json, {V2}", JSON, "v2"),  # ... even when listed first
        (V2_YAML, YAML, "v2"),
        (KUBECTL, JSON, "v2"),  # protobuf aggregated not served: the JSON clause wins
        (V2BETA1, JSON, "v2beta1"),  # served on purpose (upstream: 406)
        (f"{V2BETA1},{V2}", JSON, "v2beta1"),
        ("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList", None, None),
        ("application/json;g=APIDiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList", None, None),
        (
            "application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io;profile=nopeer;x=y",
            JSON,
            "v2",
        ),
        (f"{V2};q=0", JSON, "v2"),
    ],
)
def test_aggregated_pass(accept: str, media_type: str | None, version: str | None) -> None:
    result = Negotiator(discovery_restriction)(accept)
    if media_type is None:
        assert result is None or result.aggregated_version is None
    else:
        assert result is not None and result.media_type == media_type and result.aggregated_version == version


def test_pretty_param() -> None:
    result = negotiate(parse_accept("application/json;pretty=1"), default_restriction)
    assert result is not None and result.pretty


def test_negotiator_cache_is_bounded() -> None:
    negotiator = Negotiator(default_restriction, size=4)
    for i in range(10):
        negotiator(f"application/json;x={i}")
    assert len(negotiator._cache) == 4


def _insertion_sorted(items: list[int], less: Callable[[int, int], bool]) -> list[int]:
    out = items[:]
    for i in range(1, len(out)):
        j = i
        while j > 0 and less(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


@given(st.lists(st.integers(0, 5), max_size=12))
def test_go_sort_is_insertion_sort_up_to_12(items: list[int]) -> None:
    def odd_less(a: int, b: int) -> bool:  # deliberately not a strict weak order
        return a > b or (a % 2 == 0 and b % 2 == 1)

    data = items[:]
    go_sort(data, odd_less)
    assert data == _insertion_sorted(items, odd_less)


@given(st.lists(st.integers(-50, 50), min_size=13, max_size=300))
def test_go_sort_sorts_long_inputs(items: list[int]) -> None:
    data = items[:]
    go_sort(data, lambda a, b: a < b)
    assert data == sorted(items)


def test_go_sort_patterns() -> None:
    for n in (13, 50, 51, 200, 1000):
        for data in (
            list(range(n)),
            list(range(n, 0, -1)),
            [5] * n,
            [random.Random(n).randint(0, 9) for _ in range(n)],
        ):
            copy = data[:]
            go_sort(copy, lambda a, b: a < b)
            assert copy == sorted(data)
