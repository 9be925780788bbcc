"""Label and field selectors with apimachinery's syntax (`labels.Parse`, `fields.ParseSelector`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aggregator.model.fielderrors import go_quote


class SelectorError(ValueError):
    """A selector that does not parse; the message is what the 400 Status says."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        op = self.operator
        if op in ("=", "in"):
            return present and value in self.values
        if op in ("!=", "notin"):
            return not present or value not in self.values
        if op == "exists":
            return present
        if op == "!":
            return not present
        if not present:
            return False
        try:
            left, right = int(value), int(self.values[0])
        except ValueError:
            return False
        return left > right if op == "gt" else left < right


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=|>|<)\s*(?P<value>{_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `( ... )`."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_label_selector(text: str) -> list[Requirement]:
    """Requirements ANDed together; an empty selector selects everything."""
    if not text.strip():
        return []
    requirements = []
    for part in _split_top_level(text):
        if m := _SET.match(part):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(
                    f"unable to parse requirement: values: Invalid value: {go_quote(part.strip())}: "
                    "for 'in', 'notin' operators, values set can't be empty"
                )
            requirements.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ.match(part):
            op = {"==": "=", ">": "gt", "<": "lt"}.get(m["op"], m["op"])
            requirements.append(Requirement(m["key"], op, (m["value"],)))
        elif m := _EXISTS.match(part):
            requirements.append(Requirement(m["key"], "!" if m["neg"] else "exists"))
        else:
            raise SelectorError(
                f"unable to parse requirement: {go_quote(part.strip())} is not a valid label selector"
            )
    return requirements


FIELD_LABELS = ("metadata.name", "metadata.namespace")


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    """(field, operator "=" or "!=", value) triples; only metadata.name and metadata.namespace exist."""
    out: list[tuple[str, str, str]] = []
    if not text.strip():
        return out
    for part in text.split(","):
        m = re.match(r"^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise SelectorError(f"invalid selector: {go_quote(text)}; can't understand {go_quote(part)}")
        field_name, op, value = m[1], m[2], m[3]
        if field_name not in FIELD_LABELS:
            raise SelectorError(
                f"{go_quote(field_name)} is not a known field selector: only "
                f"{go_quote(FIELD_LABELS[0])}, {go_quote(FIELD_LABELS[1])}"
            )
        out.append((field_name, "!=" if op == "!=" else "=", value))
    return out


Predicate = Callable[[dict[str, object]], bool]


def object_predicate(label_selector: str, field_selector: str) -> Predicate:
    """One function deciding whether an object (any version: only metadata is read) is selected."""
    requirements = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector)

    def matches(obj: dict[str, object]) -> bool:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in requirements):
            return False
        for field_name, op, value in fields:
            actual = meta.get(field_name.split(".", 1)[1]) or ""
            if (actual == value) != (op == "="):
                return False
        return True

    return matches
