"""Which objects a list or watch selects: apimachinery's label and field selectors over metadata."""

from __future__ import annotations

from collections.abc import Callable

from aggregator.model.fielderrors import go_quote
from aggregator.model.selectors import (
    NOT_EQUALS,
    FieldRequirement,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

__all__ = ["FIELD_LABELS", "Predicate", "SelectorError", "object_predicate", "supported_fields"]

# The field labels a wardle object supports (the generic ObjectMeta ones).
FIELD_LABELS = ("metadata.name", "metadata.namespace")

Predicate = Callable[[dict[str, object]], bool]


def supported_fields(selector: str) -> tuple[FieldRequirement, ...]:
    """The parsed field selector; a field other than the supported labels is upstream's 400."""
    requirements = parse_field_selector(selector)
    for requirement in requirements:
        if requirement.field not in FIELD_LABELS:
            raise SelectorError(
                f"{go_quote(requirement.field)} is not a known field selector: only "
                f"{go_quote(FIELD_LABELS[0])}, {go_quote(FIELD_LABELS[1])}"
            )
    return requirements


def object_predicate(label_selector: str, field_selector: str) -> Predicate:
    """One function deciding whether an object (any version: only metadata is read) is selected."""
    labels_wanted = parse_label_selector(label_selector)
    fields_wanted = supported_fields(field_selector)

    def matches(obj: dict[str, object]) -> bool:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in labels_wanted):
            return False
        for requirement in fields_wanted:
            actual = meta.get(requirement.field.split(".", 1)[1]) or ""
            if (actual == requirement.value) == (requirement.operator == NOT_EQUALS):
                return False
        return True

    return matches
