"""`meta.k8s.io` Table output, the way kube-apiserver renders it for `kubectl get`.

Columns follow the CRD convention (Name, Age, then extra columns; `priority: 1` ones are shown by
`-o wide` only). Ages are rendered on the server with apimachinery's `duration.HumanDuration`.
Rows carry the object as `includeObject` asks: `Metadata` (default) a PartialObjectMetadata,
`Object` the full object, `None` nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from aggregator.model.meta import human_duration
from sample_apiserver.api import AGE_COLUMN, ResourceType

JSON = dict[str, Any]

INCLUDE_OBJECT_VALUES = ("", "None", "Metadata", "Object")


def parse_time(value: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return None


def age_cell(timestamp: Any, now: dt.datetime) -> str:
    """`ConvertToHumanReadableDateType`: `<unknown>` for a zero time, `<invalid>` if unparsable."""
    if not timestamp:
        return "<unknown>"
    when = parse_time(str(timestamp))
    if when is None:
        return "<invalid>"
    return human_duration((now - when).total_seconds())


def column_definitions(resource: ResourceType) -> list[JSON]:
    return [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in resource.columns()
    ]


def partial_metadata(obj: JSON, table_version: str) -> JSON:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{table_version}",
        "metadata": obj["metadata"],
    }


def render_table(
    resource: ResourceType,
    objects: list[JSON],
    *,
    list_meta: JSON,
    include_object: str,
    table_version: str,
    headers: bool = True,
    now: dt.datetime | None = None,
) -> JSON:
    """A Table for versioned objects; `headers=False` for watch events after the first."""
    moment = now or dt.datetime.now(dt.UTC)
    columns = resource.columns()
    rows = []
    for obj in objects:
        cells = [age_cell(c.cell(obj), moment) if c is AGE_COLUMN else c.cell(obj) for c in columns]
        row: JSON = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object in ("", "Metadata"):
            row["object"] = partial_metadata(obj, table_version)
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{table_version}",
        "metadata": list_meta,
        "columnDefinitions": column_definitions(resource) if headers else None,
        "rows": rows,
    }
