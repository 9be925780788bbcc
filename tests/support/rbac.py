"""RBAC manifests for tests, as a folder would hold them (`rbac.authorization.k8s.io/v1`)."""

from __future__ import annotations

from typing import Any

GROUP = "rbac.authorization.k8s.io"
Manifest = dict[str, Any]


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name}


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "name": name}


def rule(
    verbs: list[str], groups: list[str], resources: list[str], names: list[str] | None = None
) -> Manifest:
    out: Manifest = {"verbs": verbs, "apiGroups": groups, "resources": resources}
    if names:
        out["resourceNames"] = names
    return out


def cluster_role(name: str, *rules: Manifest, labels: dict[str, str] | None = None) -> Manifest:
    metadata: Manifest = {"name": name, **({"labels": labels} if labels else {})}
    return {"apiVersion": f"{GROUP}/v1", "kind": "ClusterRole", "metadata": metadata, "rules": list(rules)}


def cluster_role_binding(name: str, role: str, *subjects: dict[str, str]) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": list(subjects),
    }


def may_impersonate(who: str, *users: str) -> list[Manifest]:
    """`who` may impersonate exactly these users."""
    role = f"impersonate-{'-'.join(users)}"
    return [
        cluster_role(role, rule(["impersonate"], [""], ["users"], list(users))),
        cluster_role_binding(f"{who}-as-{'-'.join(users)}", role, user(who)),
    ]
