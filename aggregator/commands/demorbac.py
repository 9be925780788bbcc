"""The demo's RBAC manifests: who may do what through the demo's gateway.

Local mode authorizes with the RBAC manifests of its folder (`auth/rbacfolder.py`), so the demo
ships some to show it: admin (also in system:masters) is bound to the built-in `cluster-admin`,
and alice (group `wardle-viewers`) may read fischers and nothing else of wardle.example.com. Her
`kubectl get flunders` is refused by the gateway itself, and so is any `--as`: nothing grants
her `impersonate`. The sample server trusts `wardle-viewers` like system:masters
(`demo.sample_command`), so what alice may do is what the gateway's RBAC says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggregator.commands.demofiles import DemoLayout

VIEWERS = "wardle-viewers"
_RBAC = "rbac.authorization.k8s.io"


def rbac_manifests(layout: DemoLayout) -> Path:
    return layout.apiservices / "rbac.yaml"


def demo_rbac() -> list[dict[str, Any]]:
    def bind(name: str, role: str, subject: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": f"{_RBAC}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{**subject, "apiGroup": _RBAC}],
        }

    return [
        bind("demo-admin", "cluster-admin", {"kind": "User", "name": "admin"}),
        {
            "apiVersion": f"{_RBAC}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "fischer-reader"},
            "rules": [
                {"apiGroups": ["wardle.example.com"], "resources": ["fischers"], "verbs": ["get", "list", "watch"]}
            ],
        },
        bind("wardle-viewers-read-fischers", "fischer-reader", {"kind": "Group", "name": VIEWERS}),
    ]
