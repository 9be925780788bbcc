"""Group and version order of legacy discovery (kube-aggregator `helper.SortedByGroupAndVersion`).

A group sits where its first member falls in the global order (groupPriorityMinimum descending,
APIService name ascending): at its highest groupPriorityMinimum, ties broken by the smallest
APIService *name* among the members at that priority, not by the group name (aggregated discovery
uses the group name; the two documents really do differ). Inside a group, versions go by
versionPriority descending, then kube-aware version order.
"""

from __future__ import annotations

from collections.abc import Iterable

from aggregator.model.apiservice import APIService
from aggregator.model.versions import version_sort_key


def _global_key(svc: APIService) -> tuple[int, str]:
    return (-svc.group_priority_minimum, svc.name)


def version_order_key(svc: APIService) -> tuple[int, object, str]:
    """`ByVersionPriority`; the name settles versions that compare equal (`v01` vs `v1`)."""
    return (-svc.version_priority, version_sort_key(svc.version), svc.name)


def sort_group_versions(members: Iterable[APIService]) -> list[APIService]:
    """The members of one group, preferred version first."""
    return sorted(members, key=version_order_key)


def sorted_by_group_and_version(apiservices: Iterable[APIService]) -> list[list[APIService]]:
    """APIServices grouped by `spec.group`, groups in legacy discovery order, each sorted by version."""
    groups: dict[str, list[APIService]] = {}
    for svc in sorted(apiservices, key=_global_key):
        groups.setdefault(svc.group, []).append(svc)
    return [sort_group_versions(members) for members in groups.values()]
