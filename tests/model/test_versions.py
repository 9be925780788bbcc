"""Kube-aware version ordering, including the traps a naive port falls into."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.model.versions import (
    compare_kube_aware_versions,
    parse_kube_version,
    sort_by_version,
    sort_versions,
)

DOC_ORDER = ["v10", "v2", "v1", "v11beta2", "v10beta3", "v3beta1", "v12alpha1", "v11alpha2", "foo1", "foo10"]


def test_upstream_doc_example_order() -> None:
    shuffled = DOC_ORDER[:]
    for seed in range(20):
        random.Random(seed).shuffle(shuffled)
        assert sort_versions(shuffled) == DOC_ORDER


@pytest.mark.parametrize(
    ("v1", "v2", "sign"),
    [
        ("v1", "v1", 0),
        ("v2", "v1", 1),  # higher major first
        ("v1", "v2beta1", 1),  # GA beats beta even with a lower major
        ("v1beta1", "v9alpha9", 1),  # beta beats alpha
        ("v1beta2", "v1beta1", 1),
        ("v1", "foo", 1),  # kube-like before anything else
        ("foo", "v1", -1),
        ("a", "b", 1),  # non-kube: ascending, so "a" is preferred over "b"
        ("foo1", "foo10", 1),
        ("v01", "v1", 0),  # leading zeros parse to the same number
    ],
)
def test_compare(v1: str, v2: str, sign: int) -> None:
    assert compare_kube_aware_versions(v1, v2) == sign
    assert compare_kube_aware_versions(v2, v1) == -sign


@pytest.mark.parametrize(
    "version",
    [
        "V1",
        "v1.0",
        "v1alpha",
        "v1rc1",
        "v1 ",
        " v1",
        "v1\n",  # Python's `$` would accept this; Go's does not
        "v",
        "valpha1",
        "v1beta1a",
        "v\u0661",  # ARABIC-INDIC DIGIT ONE: \d in Python, not in Go
        "v1beta\u0662",
        "v9223372036854775808",  # int64 overflow: Atoi fails
        "v1alpha9223372036854775808",
    ],
)
def test_not_kube_like(version: str) -> None:
    assert parse_kube_version(version) is None
    assert compare_kube_aware_versions("v1alpha1", version) == 1


def test_int64_max_is_still_kube_like() -> None:
    assert parse_kube_version("v9223372036854775807") == (2, 9223372036854775807, 0)
    assert sort_versions(["v9223372036854775808", "v9223372036854775807", "v1"]) == [
        "v9223372036854775807",
        "v1",
        "v9223372036854775808",
    ]


def test_non_kube_versions_sort_ascending_by_code_point() -> None:
    assert sort_versions(["zeta", "Zeta", "alpha", "é", "v1"]) == ["v1", "Zeta", "alpha", "zeta", "é"]


def test_equal_spellings_get_a_stable_order() -> None:
    assert sort_versions(["v1", "v01"]) == sort_versions(["v01", "v1"]) == ["v01", "v1"]


def test_sort_by_version_on_objects() -> None:
    items = [("a", "v1beta1"), ("b", "v2"), ("c", "v1")]
    assert [i[0] for i in sort_by_version(items, lambda i: i[1])] == ["b", "c", "a"]


versions = st.one_of(
    st.from_regex(r"\Av[0-9]{1,3}((alpha|beta)[0-9]{1,3})?\Z"),
    st.text(alphabet="abv019", min_size=1, max_size=6),
)


@given(versions, versions)
def test_antisymmetric(a: str, b: str) -> None:
    assert compare_kube_aware_versions(a, b) == -compare_kube_aware_versions(b, a)


@given(st.lists(versions, max_size=12))
def test_sorted_output_is_ordered(items: list[str]) -> None:
    ordered = sort_versions(items)
    assert sorted(ordered) == sorted(items)
    for first, second in itertools.pairwise(ordered):
        assert compare_kube_aware_versions(first, second) >= 0


@given(
    st.lists(
        st.one_of(
            st.from_regex(r"v[0-9]{1,3}((alpha|beta)[0-9]{1,3})?", fullmatch=True),
            st.from_regex(r"v0*[0-9]{1,2}", fullmatch=True),
            st.text(min_size=1, max_size=6),
        ),
        max_size=12,
    )
)
def test_the_tuple_key_orders_exactly_as_the_go_comparison(versions: list[str]) -> None:
    def descending(a: str, b: str) -> int:
        order = compare_kube_aware_versions(b, a)
        return order if order else (a > b) - (a < b)

    assert sort_versions(versions) == sorted(versions, key=functools.cmp_to_key(descending))
