"""Label and field selectors for listing and watching APIServices (equality-based labels and
`metadata.name`, what kube-apiserver supports for this resource)."""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.model.apiservice import APIService


def _requirements(selector: str, what: str) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for raw in filter(None, (p.strip() for p in selector.split(","))):
        for op in ("!=", "==", "="):
            if op in raw:
                key, _, value = raw.partition(op)
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            if " in " in raw or " notin " in raw or "(" in raw:
                raise ValueError(
                    f"unable to parse requirement: {what} set-based selectors are not supported here: {raw!r}"
                )
            if raw.startswith("!"):
                out.append((raw[1:].strip(), "!", ""))
            else:
                out.append((raw, "exists", ""))
    return out


def matches(svc: APIService | None, label_selector: str, field_selector: str) -> bool:
    """Equality-based label selectors and the `metadata.name` field selector (all APIServices support)."""
    labels_req = _requirements(label_selector, "label")
    fields_req = _requirements(field_selector, "field")
    for key, op, _ in fields_req:
        if key != "metadata.name" or op in ("exists", "!"):
            raise ValueError(f"field label not supported: {key}")
    if svc is None:
        return True
    meta = svc.raw.get("metadata") if isinstance(svc.raw.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    for key, op, value in labels_req:
        present = key in labels
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return all((op == "=") == (svc.name == value) for _, op, value in fields_req)
