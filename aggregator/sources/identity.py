"""The fields kube-apiserver fills in for an object it stores, for the folder's APIServices.

On create `rest.BeforeCreate` sets `metadata.uid` and `metadata.creationTimestamp`
(`FillObjectMetaSystemFields`), whatever the manifest says; on update `rest.BeforeUpdate` keeps
the old object's. The folder source does the same as it puts an object in the store, so the
identity is the store's: with `--workers N` the control process sets it once and every worker
serves the object it received, instead of each worker making up a uid and a creation time of
its own when it first saw the object (`kubectl get apiservice -o yaml` then differed by worker,
and a worker started later showed a `creationTimestamp` after the condition's
`lastTransitionTime`).

A condition the manifest carries is taken as recorded at creation at the earliest, so its
`lastTransitionTime` is never before `creationTimestamp`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from aggregator.model.apiservice import APIService, Condition, now_rfc3339


def _metadata(svc: APIService) -> Mapping[str, Any]:
    metadata = svc.raw.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _instant(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _not_before(condition: Condition, created: str) -> Condition:
    given, floor = condition.last_transition_time, _instant(created)
    when = _instant(given) if given else None
    if when is None or floor is None or when.tzinfo is None or when >= floor:
        return condition
    return replace(condition, last_transition_time=created)


def with_system_fields(
    new: APIService,
    current: APIService | None,
    *,
    now: Callable[[], str] = now_rfc3339,
    new_uid: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> APIService:
    """`new` with the uid and creationTimestamp of `current` (the stored object of that name), or
    new ones when there is none (or it has none)."""
    held = _metadata(current) if current is not None else {}
    uid, created = held.get("uid"), held.get("creationTimestamp")
    conditions = new.conditions
    if not (isinstance(uid, str) and uid and isinstance(created, str) and created):
        uid, created = new_uid(), now()
        conditions = tuple(_not_before(c, created) for c in new.conditions)
    metadata = {**_metadata(new), "uid": uid, "creationTimestamp": created}
    return replace(new, conditions=conditions, raw={**new.raw, "metadata": metadata})
