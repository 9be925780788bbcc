"""Strict decoding names the field at fault, down to the list item (`rules[1].verbs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from aggregator.model.decode import DecodeError, each, field


def _verbs(item: Any, path: str) -> tuple[str, ...]:
    assert isinstance(item, Mapping)
    return tuple(field(item, "verbs", list, f"{path}.verbs", []))


def test_each_decodes_every_item_in_order() -> None:
    doc = {"rules": [{"verbs": ["get"]}, {}, {"verbs": ["list", "watch"]}]}
    assert each(doc, "rules", "spec.rules", _verbs) == (("get",), (), ("list", "watch"))


def test_each_of_an_absent_list_is_empty() -> None:
    assert each({}, "rules", "spec.rules", _verbs) == ()


def test_an_error_names_the_item_it_is_in() -> None:
    doc = {"rules": [{"verbs": ["get"]}, {"verbs": "get"}]}
    with pytest.raises(DecodeError, match=r"^spec\.rules\[1\]\.verbs: expected array, got str$"):
        each(doc, "rules", "spec.rules", _verbs)


def test_a_list_of_the_wrong_type_is_named() -> None:
    with pytest.raises(DecodeError, match=r"^spec\.rules: expected array"):
        each({"rules": {"verbs": []}}, "rules", "spec.rules", _verbs)
