"""Label and field selectors for listing and watching APIServices.

The selectors are parsed exactly as apimachinery parses them (`model/selectors.py`: set-based label
requirements included, upstream's error messages); of the fields, an APIService supports
`metadata.name`, as kube-apiserver's generic cluster-scoped field set does for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.model.apiservice import APIService
from aggregator.model.selectors import NOT_EQUALS, parse_field_selector, parse_label_selector

FIELD_LABELS = ("metadata.name",)


def matches(svc: APIService | None, label_selector: str, field_selector: str) -> bool:
    """Whether `svc` is selected (None: only validate the selectors). Raises ValueError (a
    `SelectorError`, or `field label not supported: <field>`) for what upstream answers with 400."""
    labels_wanted = parse_label_selector(label_selector)
    fields_wanted = parse_field_selector(field_selector)
    for requirement in fields_wanted:
        if requirement.field not in FIELD_LABELS:
            raise ValueError(f"field label not supported: {requirement.field}")
    if svc is None:
        return True
    meta = svc.raw.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    if not all(requirement.matches(labels) for requirement in labels_wanted):
        return False
    return all((svc.name == r.value) != (r.operator == NOT_EQUALS) for r in fields_wanted)
