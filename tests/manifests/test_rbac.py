"""The gateway's RBAC grants every kube-apiserver call the code makes, and nothing more.

Every call is declared once as an `ApiCall` in `aggregator/kube/calls.py` (the client refuses
undeclared ones). Here each is turned into the request attributes kube-apiserver's RBAC
authorizer sees and evaluated against what the manifests bind to the gateway's service account,
plus the built-in roles they bind (transcribed from upstream's bootstrap policy,
plugin/pkg/auth/authorizer/rbac/bootstrappolicy). The evaluation follows upstream's
`rbac/v1` `RuleAllows`: verb, API group, `resource[/subresource]`, resourceNames, and
non-resource URLs with a trailing `*`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from aggregator.kube import calls
from aggregator.kube.calls import ApiCall, declared_calls
from tests.manifests.k8s import KUBECTL, MANIFESTS, Obj, kustomize, served_resources

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH (kustomize builds)")

NAMESPACE = "aggregator-system"
ACCOUNT = "aggregator"
# Who the gateway is to kube-apiserver: its service account and the groups every one has.
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated")

# The one object a namespaced call is made for, when it is not made across all namespaces: the
# auth ConfigMap, and the leader-election Lease (--leader-elect-resource-namespace defaults to the
# pod's namespace, --leader-elect-resource-name to `aggregator`).
CALL_TARGETS = {
    ("", "configmaps"): ("kube-system", "extension-apiserver-authentication"),
    ("coordination.k8s.io", "leases"): (NAMESPACE, "aggregator"),
}

# Calls that belong to an optional overlay, not to the base.
OVERLAY_OF = {
    ("apiregistration.k8s.io", "apiservices/status"): "write-apiservice-status",
    # Leader election exists to elect the one replica that writes status.
    ("coordination.k8s.io", "leases"): "write-apiservice-status",
}

IMPERSONATION_RESOURCES = {"users", "groups", "serviceaccounts", "uids", "userextras"}


def _rule(
    verbs: Iterable[str], groups: Iterable[str] = (), resources: Iterable[str] = (), **extra: Any
) -> Obj:
    rule: Obj = {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}
    rule.update(extra)
    return rule


def _binding(
    kind: str, name: str, role_kind: str, role: str, subjects: list[Obj], namespace: str = ""
) -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": subjects,
    }


def _group(name: str) -> Obj:
    return {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": name}


# Upstream's bootstrap roles and bindings that the manifests rely on (policy.go, namespace_policy.go).
BUILTIN: list[Obj] = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:auth-delegator"},
        "rules": [
            _rule(["create"], ["authentication.k8s.io"], ["tokenreviews"]),
            _rule(["create"], ["authorization.k8s.io"], ["subjectaccessreviews"]),
        ],
    },
    {
        "kind": "Role",
        "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system"},
        "rules": [
            _rule(
                ["get", "list", "watch"],
                [""],
                ["configmaps"],
                resourceNames=["extension-apiserver-authentication"],
            )
        ],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:discovery"},
        "rules": [
            {
                "verbs": ["get"],
                "nonResourceURLs": [
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                    "/version/",
                ],
            }
        ],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:public-info-viewer"},
        "rules": [
            {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]}
        ],
    },
    _binding(
        "ClusterRoleBinding",
        "system:discovery",
        "ClusterRole",
        "system:discovery",
        [_group("system:authenticated")],
    ),
    _binding(
        "ClusterRoleBinding",
        "system:public-info-viewer",
        "ClusterRole",
        "system:public-info-viewer",
        [_group("system:authenticated"), _group("system:unauthenticated")],
    ),
]


# --- an RBAC authorizer, as upstream's ---------------------------------------------------------------


@dataclass(frozen=True)
class Attributes:
    """What kube-apiserver's authorizer sees for one request."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    path: str = ""

    @property
    def is_resource(self) -> bool:
        return not self.path


def _rule_allows(rule: Obj, attrs: Attributes) -> bool:
    verbs = rule.get("verbs", [])
    if attrs.verb not in verbs and "*" not in verbs:
        return False
    if not attrs.is_resource:
        return any(
            url == attrs.path or url == "*" or (url.endswith("*") and attrs.path.startswith(url[:-1]))
            for url in rule.get("nonResourceURLs", [])
        )
    groups = rule.get("apiGroups", [])
    if attrs.group not in groups and "*" not in groups:
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources", [])
    if not any(
        r in ("*", combined) or (attrs.subresource and r == f"*/{attrs.subresource}") for r in resources
    ):
        return False
    names = rule.get("resourceNames", [])
    return not names or attrs.name in names


def _subject_is_gateway(subject: Obj) -> bool:
    if subject.get("kind") == "ServiceAccount":
        return (subject.get("namespace"), subject.get("name")) == (NAMESPACE, ACCOUNT)
    if subject.get("kind") == "User":
        return subject.get("name") == USER
    return subject.get("kind") == "Group" and subject.get("name") in GROUPS


class Authorizer:
    """The gateway service account's permissions in a cluster holding `objs` (+ the built-ins)."""

    def __init__(self, objs: list[Obj]) -> None:
        everything = [*objs, *BUILTIN]
        self.roles = {
            (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
            for o in everything
            if o["kind"] in ("Role", "ClusterRole")
        }
        self.bindings = [o for o in everything if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]

    def role_of(self, binding: Obj) -> Obj:
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        role = self.roles.get((ref["kind"], namespace, ref["name"]))
        assert role is not None, f"{binding['kind']} {binding['metadata']['name']} binds a missing {ref}"
        return role

    def granting_roles(self, attrs: Attributes) -> list[str]:
        """Names of the roles that allow `attrs` to the gateway (empty = forbidden)."""
        granted = []
        for binding in self.bindings:
            if not any(_subject_is_gateway(s) for s in binding.get("subjects", [])):
                continue
            if binding["kind"] == "RoleBinding" and (
                not attrs.is_resource or binding["metadata"]["namespace"] != attrs.namespace
            ):
                continue  # a RoleBinding grants only inside its namespace
            role = self.role_of(binding)
            if any(_rule_allows(rule, attrs) for rule in role.get("rules", [])):
                granted.append(role["metadata"]["name"])
        return granted

    def allows(self, attrs: Attributes) -> bool:
        return bool(self.granting_roles(attrs))


def attributes_of(call: ApiCall) -> Attributes:
    """The authorizer attributes of `call` as the gateway makes it."""
    if call.path:
        return Attributes(verb=call.verb, path=call.path)
    namespace, name = "", ""
    target = CALL_TARGETS.get((call.group, call.resource))
    if target is not None:
        # A list/watch of one named object uses fieldSelector=metadata.name=..., which RBAC
        # matches against resourceNames like a get. A create names no object to RBAC.
        namespace, name = target
        if call.verb == "create":
            name = ""
    elif call.verb in ("get", "update", "patch", "delete") or call.subresource:
        name = "any-object"
    return Attributes(
        verb=call.verb,
        group=call.group,
        resource=call.resource,
        subresource=call.subresource,
        name=name,
        namespace=namespace,
    )


def overlay_of(call: ApiCall) -> str:
    return OVERLAY_OF.get((call.group, call.rbac_resource), "base")


@pytest.fixture(scope="module")
def builds() -> dict[str, list[Obj]]:
    return {
        "base": kustomize(MANIFESTS / "base"),
        "write-apiservice-status": kustomize(MANIFESTS / "overlays/write-apiservice-status"),
        "impersonate": kustomize(MANIFESTS / "overlays/impersonate"),
    }


CALLS = sorted(declared_calls(), key=str)


def test_the_client_layer_declares_calls() -> None:
    # Guards the enumeration itself: the object source's list+watch calls are always there.
    assert {calls.LIST_APISERVICES, calls.WATCH_APISERVICES, calls.LIST_SERVICES} <= set(CALLS)


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_every_declared_call_is_granted_where_it_is_made(call: ApiCall, builds: dict[str, list[Obj]]) -> None:
    attrs = attributes_of(call)
    overlay = overlay_of(call)
    assert Authorizer(builds[overlay]).allows(attrs), (
        f"{call} ({attrs}) is not granted to {USER} by manifests/{'' if overlay == 'base' else 'overlays/'}"
        f"{overlay}: add a rule"
    )
    if overlay != "base":
        assert not Authorizer(builds["base"]).allows(attrs), f"{call} must only be granted by {overlay}"


def _granted_triples(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in role.get("rules", [])
        for verb in rule.get("verbs", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
    }


def _needed_triples(overlay: str) -> set[tuple[str, str, str]]:
    needed = {(c.verb, c.group, c.rbac_resource) for c in CALLS if c.resource and overlay_of(c) == overlay}
    # `get` reveals nothing `list` does not: a role that may list may also get.
    needed |= {("get", g, r) for v, g, r in needed if v == "list"}
    return needed


@pytest.mark.parametrize(
    ("overlay", "kind", "role"),
    [
        ("base", "ClusterRole", "aggregator"),
        ("write-apiservice-status", "ClusterRole", "aggregator:apiservice-status-writer"),
        ("write-apiservice-status", "Role", "aggregator:leader-election"),
    ],
)
def test_the_gateways_roles_grant_nothing_the_code_does_not_call(
    overlay: str, kind: str, role: str, builds: dict[str, list[Obj]]
) -> None:
    # Least privilege: beyond the declared calls, only what system:auth-delegator (which every
    # delegating server is bound to) grants anyway.
    (granting,) = [o for o in builds[overlay] if o["kind"] == kind and o["metadata"]["name"] == role]
    delegator = _granted_triples(BUILTIN[0])
    extra = _granted_triples(granting) - _needed_triples(overlay) - delegator
    assert not extra, f"{role} grants {sorted(extra)} but no ApiCall in aggregator/kube/calls.py needs it"


def test_the_lease_role_reaches_only_the_gateways_lease(builds: dict[str, list[Obj]]) -> None:
    # As bootstrappolicy grants kube-controller-manager: create any Lease (a create has no name),
    # read and write only the named one, and all of it only in the gateway's namespace.
    authz = Authorizer(builds["write-apiservice-status"])

    def lease(verb: str, name: str = "aggregator", namespace: str = NAMESPACE) -> Attributes:
        return Attributes(verb, "coordination.k8s.io", "leases", name=name, namespace=namespace)

    for verb in ("get", "update"):
        assert authz.granting_roles(lease(verb)) == ["aggregator:leader-election"]
        assert not authz.allows(lease(verb, name="kube-controller-manager"))
        assert not authz.allows(lease(verb, namespace="kube-system"))
    assert authz.granting_roles(lease("create", name="")) == ["aggregator:leader-election"]
    assert not authz.allows(lease("create", name="", namespace="kube-system"))
    for verb in ("list", "watch", "delete", "patch"):
        assert not authz.allows(lease(verb)), verb


def test_the_base_binds_the_delegation_roles_every_extension_server_has(builds: dict[str, list[Obj]]) -> None:
    authz = Authorizer(builds["base"])
    token_review = Attributes(verb="create", group="authentication.k8s.io", resource="tokenreviews")
    access_review = Attributes(verb="create", group="authorization.k8s.io", resource="subjectaccessreviews")
    assert "system:auth-delegator" in authz.granting_roles(token_review)
    assert "system:auth-delegator" in authz.granting_roles(access_review)
    auth_config = Attributes(
        verb="watch",
        resource="configmaps",
        name="extension-apiserver-authentication",
        namespace="kube-system",
    )
    assert authz.granting_roles(auth_config) == ["extension-apiserver-authentication-reader"]


def test_the_authorizer_used_here_can_deny(builds: dict[str, list[Obj]]) -> None:
    # The checks above mean something only if ungranted requests are refused.
    authz = Authorizer(builds["base"])
    denied = [
        Attributes(verb="delete", group="apiregistration.k8s.io", resource="apiservices", name="x"),
        Attributes(
            verb="update",
            group="apiregistration.k8s.io",
            resource="apiservices",
            subresource="status",
            name="x",
        ),
        Attributes(verb="get", resource="secrets", name="x", namespace=NAMESPACE),
        Attributes(verb="get", resource="configmaps", name="other", namespace="kube-system"),
        Attributes(verb="list", resource="configmaps", namespace="kube-system"),  # no name: not one object
        Attributes(
            verb="watch",
            resource="configmaps",
            name="extension-apiserver-authentication",
            namespace="default",
        ),
        Attributes(verb="impersonate", resource="users", name="alice"),
        Attributes(verb="get", path="/metrics"),
    ]
    for attrs in denied:
        assert not authz.allows(attrs), attrs
    assert authz.allows(Attributes(verb="get", path="/apis/apps/v1"))  # system:discovery


def _impersonation_of(user: str, groups: list[str], uid: str, extra: list[str]) -> list[Attributes]:
    """The checks kube-apiserver's impersonation filter makes for Impersonate-* headers."""
    checks = []
    if user.startswith("system:serviceaccount:"):
        namespace, name = user.split(":")[2:4]
        checks.append(Attributes("impersonate", resource="serviceaccounts", name=name, namespace=namespace))
    else:
        checks.append(Attributes("impersonate", resource="users", name=user))
    checks += [Attributes("impersonate", resource="groups", name=g) for g in groups]
    if uid:
        checks.append(Attributes("impersonate", group="authentication.k8s.io", resource="uids", name=uid))
    checks += [
        Attributes(
            "impersonate", group="authentication.k8s.io", resource="userextras", subresource=key, name="v"
        )
        for key in extra
    ]
    return checks


CALLERS = {
    "a user from a client certificate": ("alice", ["devs", "system:authenticated"], "", []),
    "a pod's service account token": (
        "system:serviceaccount:apps:web",
        ["system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"],
        "6a2b1f0e-uid",
        [
            "authentication.kubernetes.io/credential-id",
            "authentication.kubernetes.io/node-name",
            "authentication.kubernetes.io/node-uid",
            "authentication.kubernetes.io/pod-name",
            "authentication.kubernetes.io/pod-uid",
        ],
    ),
}


@pytest.mark.parametrize("caller", CALLERS, ids=str)
def test_impersonation_is_granted_only_by_its_overlay(caller: str, builds: dict[str, list[Obj]]) -> None:
    checks = _impersonation_of(*CALLERS[caller])
    overlay = Authorizer(builds["impersonate"])
    for attrs in checks:
        assert overlay.granting_roles(attrs) == ["aggregator:impersonator"], attrs
    for name in ("base", "write-apiservice-status"):
        assert not any(Authorizer(builds[name]).allows(a) for a in checks), name
    # An extra key kube-apiserver does not set itself is refused until the operator lists it.
    odd = Attributes(
        "impersonate", group="authentication.k8s.io", resource="userextras", subresource="scopes"
    )
    assert not overlay.allows(odd)


def test_every_rule_names_a_resource_kubernetes_serves(builds: dict[str, list[Obj]]) -> None:
    served = {(group, plural) for group, _, plural in served_resources()}
    for objs in builds.values():
        for role in (o for o in objs if o["kind"] in ("Role", "ClusterRole")):
            for rule in role.get("rules", []):
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        base = resource.split("/", 1)[0]
                        if "impersonate" in rule["verbs"] and base in IMPERSONATION_RESOURCES:
                            continue  # RBAC-only resources of the impersonation filter
                        assert (group, base) in served, f"{role['metadata']['name']}: {group}/{resource}"


def test_every_binding_is_for_the_gateway_and_names_an_existing_role(builds: dict[str, list[Obj]]) -> None:
    for objs in builds.values():
        authz = Authorizer(objs)
        for binding in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            authz.role_of(binding)
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}
            ]
