"""Manifests of FlowSchemas and priority levels for the tests, written as a user writes them."""

from __future__ import annotations

from typing import Any

API_VERSION = "flowcontrol.apiserver.k8s.io/v1"
Doc = dict[str, Any]


def flow_schema(
    name: str,
    level: str,
    *,
    precedence: int = 500,
    users: tuple[str, ...] = (),
    groups: tuple[str, ...] = (),
    distinguisher: str | None = "ByUser",
    resource_rules: list[Doc] | None = None,
    non_resource_rules: list[Doc] | None = None,
    uid: str | None = None,
) -> Doc:
    subjects = [{"kind": "User", "user": {"name": u}} for u in users]
    subjects += [{"kind": "Group", "group": {"name": g}} for g in groups]
    rule: Doc = {"subjects": subjects}
    if resource_rules is None and non_resource_rules is None:
        resource_rules = [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
        ]
        non_resource_rules = [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
    if resource_rules:
        rule["resourceRules"] = resource_rules
    if non_resource_rules:
        rule["nonResourceRules"] = non_resource_rules
    spec: Doc = {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence, "rules": [rule]}
    if distinguisher is not None:
        spec["distinguisherMethod"] = {"type": distinguisher}
    metadata: Doc = {"name": name}
    if uid is not None:
        metadata["uid"] = uid
    return {"apiVersion": API_VERSION, "kind": "FlowSchema", "metadata": metadata, "spec": spec}


def priority_level(
    name: str,
    *,
    shares: int = 10,
    lendable: int | None = 0,
    borrowing: int | None = None,
    queues: int | None = 16,
    hand_size: int = 4,
    queue_length_limit: int = 50,
    uid: str | None = None,
) -> Doc:
    """A Limited level: queuing with `queues` queues, or Reject when `queues` is None."""
    response: Doc = {"type": "Reject"}
    if queues is not None:
        response = {
            "type": "Queue",
            "queuing": {"queues": queues, "handSize": hand_size, "queueLengthLimit": queue_length_limit},
        }
    limited: Doc = {"nominalConcurrencyShares": shares, "limitResponse": response}
    if lendable is not None:
        limited["lendablePercent"] = lendable
    if borrowing is not None:
        limited["borrowingLimitPercent"] = borrowing
    metadata: Doc = {"name": name}
    if uid is not None:
        metadata["uid"] = uid
    return {
        "apiVersion": API_VERSION,
        "kind": "PriorityLevelConfiguration",
        "metadata": metadata,
        "spec": {"type": "Limited", "limited": limited},
    }
