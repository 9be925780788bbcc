"""ObjectMeta and ages as apimachinery writes them: Go field order, omitempty, HumanDuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# metav1.ObjectMeta in Go struct order: the key order clients see in responses.
OBJECT_META_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
OWNER_REFERENCE_ORDER = ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")


def ordered_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """ObjectMeta with keys in Go order and empty (omitempty) fields dropped.

    Maps are written with sorted keys, as encoding/json does. `deletionGracePeriodSeconds` is a
    pointer in Go, so its 0 is kept; `generation` 0 is omitted.
    """
    out: dict[str, Any] = {}
    for key in OBJECT_META_ORDER:
        value = meta.get(key)
        if value is None or value == "" or value == {} or value == []:
            continue
        if key == "generation" and value == 0:
            continue
        if key in ("labels", "annotations") and isinstance(value, Mapping):
            value = {k: value[k] for k in sorted(value)}
        elif key == "ownerReferences" and isinstance(value, list):
            value = [
                {k: ref[k] for k in OWNER_REFERENCE_ORDER if k in ref}
                for ref in value
                if isinstance(ref, Mapping)
            ]
        out[key] = value
    return out


def human_duration(seconds_total: float) -> str:
    """apimachinery `duration.HumanDuration` (the Age column): two or three significant figures."""
    seconds = int(seconds_total)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return _two_units(minutes, "m", seconds % 60, "s")
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        return _two_units(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _two_units(hours // 24, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        return _two_units(hours // 24 // 365, "y", (hours // 24) % 365, "d")
    return f"{hours // 24 // 365}y"


def _two_units(major: int, major_unit: str, minor: int, minor_unit: str) -> str:
    """`5m30s`, or `5m` when the smaller unit is zero: HumanDuration's two-figure forms."""
    return f"{major}{major_unit}" if minor == 0 else f"{major}{major_unit}{minor}{minor_unit}"
