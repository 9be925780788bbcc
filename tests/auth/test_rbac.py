"""RBAC evaluation as kube-apiserver's RBAC authorizer does it: upstream's rule-matching table
(`plugin/pkg/auth/authorizer/rbac/rbac_test.go` TestRuleMatches), subjects, binding order and
scope, reasons, resolution errors, aggregation, the built-in roles, and the manifests' validation."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.auth.rbac import PolicyRule, RBACPolicy
from aggregator.auth.rbacobjects import Refused, compile_policy, decode
from aggregator.auth.verdict import Decision
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo

V1 = "rbac.authorization.k8s.io/v1"
ALICE = UserInfo("alice", groups=("devs", "system:authenticated"))
SA = UserInfo("system:serviceaccount:team:robot", groups=("system:serviceaccounts", "system:authenticated"))


def res(verb: str, group: str, resource: str, sub: str = "", name: str = "", ns: str = "") -> RequestInfo:
    return RequestInfo(
        is_resource_request=True,
        path="",
        verb=verb,
        api_group=group,
        resource=resource,
        subresource=sub,
        name=name,
        namespace=ns,
    )


def url(verb: str, path: str) -> RequestInfo:
    return RequestInfo(is_resource_request=False, path=path, verb=verb)


def rule(verbs: str, groups: str = "", resources: str = "", names: str = "", urls: str = "") -> PolicyRule:
    def split(text: str) -> tuple[str, ...]:
        return tuple(text.split(",")) if text else ()

    return PolicyRule(split(verbs), split(groups), split(resources), split(names), split(urls))


# (rule, request, allowed): upstream's TestRuleMatches, row for row, plus resourceNames and */sub.
RULE_CASES: list[tuple[PolicyRule, RequestInfo, bool]] = [
    # star verb, exact match other
    *(
        (rule("*", "group1", "resource1"), res(v, g, r), g == "group1" and r == "resource1")
        for v in ("verb1", "verb2")
        for g in ("group1", "group2")
        for r in ("resource1", "resource2")
    ),
    # star group, exact match other
    *(
        (rule("verb1", "*", "resource1"), res(v, g, r), v == "verb1" and r == "resource1")
        for v in ("verb1", "verb2")
        for g in ("group1", "group2")
        for r in ("resource1", "resource2")
    ),
    # star resource, exact match other
    *(
        (rule("verb1", "group1", "*"), res(v, g, r), v == "verb1" and g == "group1")
        for v in ("verb1", "verb2")
        for g in ("group1", "group2")
        for r in ("resource1", "resource2")
    ),
    # tuple expansion
    *(
        (rule("verb1,verb2", "group1,group2", "resource1,resource2"), res(v, g, r), True)
        for v in ("verb1", "verb2")
        for g in ("group1", "group2")
        for r in ("resource1", "resource2")
    ),
    # subresource expansion
    (rule("*", "*", "resource1/subresource1"), res("verb1", "group1", "resource1", "subresource1"), True),
    (rule("*", "*", "resource1/subresource1"), res("verb1", "group2", "resource1", "subresource2"), False),
    (rule("*", "*", "resource1/subresource1"), res("verb1", "group1", "resource2", "subresource1"), False),
    (rule("*", "*", "resource1/subresource1"), res("verb1", "group1", "resource1"), False),
    (rule("*", "*", "resource1"), res("verb1", "group1", "resource1", "subresource1"), False),
    (rule("*", "*", "*/subresource1"), res("verb1", "group1", "resource2", "subresource1"), True),
    (rule("*", "*", "*/subresource1"), res("verb1", "group1", "resource2", "subresource2"), False),
    (rule("*", "*", "*/subresource1"), res("verb1", "group1", "resource2"), False),
    (rule("*", "*", "*"), res("verb1", "group1", "resource2", "subresource2"), True),
    # resourceNames: none means any name; otherwise the name must be listed (a list has none)
    (rule("get", "g", "r", names="a,b"), res("get", "g", "r", name="b"), True),
    (rule("get", "g", "r", names="a,b"), res("get", "g", "r", name="c"), False),
    (rule("list", "g", "r", names="a"), res("list", "g", "r"), False),
    # the core group is "" and must be named as such
    (PolicyRule(("get",), ("",), ("pods",)), res("get", "", "pods"), True),
    (rule("get", "apps", "pods"), res("get", "", "pods"), False),
    # star nonresource, exact match other
    *(
        (rule("verb1", urls="*"), url(v, p), v == "verb1")
        for v in ("verb1", "verb2")
        for p in ("/foo", "/foo/bar", "/foo/baz", "/foo/bar/one", "/foo/baz/one")
    ),
    # star nonresource subpath
    *(
        (rule("verb1", urls="/foo/*"), url("verb1", p), p.startswith("/foo/"))
        for p in ("/foo", "/foo/bar", "/foo/bar/one", "/notfoo", "/notfoo/bar")
    ),
    # star verb, exact nonresource
    *(
        (rule("*", urls="/foo,/foo/bar/one"), url(v, p), p in ("/foo", "/foo/bar/one"))
        for v in ("verb1", "verb2")
        for p in ("/foo", "/foo/bar", "/foo/baz", "/foo/bar/one", "/foo/baz/one")
    ),
    # a prefix ending in * matches any continuation, not only after a slash
    (rule("get", urls="/healthz*"), url("get", "/healthzfoo"), True),
    # resource rules never match non-resource requests and the reverse
    (rule("*", "*", "*"), url("get", "/apis"), False),
    (rule("*", urls="*"), res("get", "g", "r"), False),
]


@pytest.mark.parametrize(("policy_rule", "info", "allowed"), RULE_CASES)
def test_rule_matching_follows_upstream(policy_rule: PolicyRule, info: RequestInfo, allowed: bool) -> None:
    assert policy_rule.allows(info) is allowed


# --- the policy: bindings, subjects, reasons ---------------------------------------------------------


def manifest(kind: str, name: str, namespace: str = "", **body: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if "labels" in body:
        meta["labels"] = body.pop("labels")
    return {"apiVersion": V1, "kind": kind, "metadata": meta, **body}


def binding(
    kind: str, name: str, role_kind: str, role: str, *subjects: dict[str, str], namespace: str = ""
) -> dict[str, Any]:
    return manifest(
        kind,
        name,
        namespace,
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        subjects=list(subjects),
    )


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name}


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "name": name}


def policy(*docs: dict[str, Any]) -> RBACPolicy:
    return compile_policy([decode(d) for d in docs], present=True)


READ_FLUNDERS = {
    "verbs": ["get", "list", "watch"],
    "apiGroups": ["wardle.example.com"],
    "resources": ["flunders"],
}


def test_a_cluster_role_binding_grants_everywhere_and_names_itself_in_the_reason() -> None:
    p = policy(
        manifest("ClusterRole", "flunder-reader", rules=[READ_FLUNDERS]),
        binding("ClusterRoleBinding", "devs-read", "ClusterRole", "flunder-reader", group("devs")),
    )
    verdict = p.authorize(ALICE, res("list", "wardle.example.com", "flunders", ns="any"))
    assert verdict.decision is Decision.ALLOW
    assert (
        verdict.reason
        == 'RBAC: allowed by ClusterRoleBinding "devs-read" of ClusterRole "flunder-reader" to Group "devs"'
    )
    assert (
        p.authorize(ALICE, res("create", "wardle.example.com", "flunders", ns="any")).decision
        is Decision.NO_OPINION
    )
    assert (
        p.authorize(UserInfo("bob"), res("list", "wardle.example.com", "flunders")).decision
        is Decision.NO_OPINION
    )


def test_a_role_binding_grants_only_in_its_namespace() -> None:
    p = policy(
        manifest("Role", "reader", "team", rules=[READ_FLUNDERS]),
        binding("RoleBinding", "alice-reads", "Role", "reader", user("alice"), namespace="team"),
        binding(
            "RoleBinding", "alice-reads-cluster-role", "ClusterRole", "view", user("alice"), namespace="other"
        ),
    )
    allowed = p.authorize(ALICE, res("get", "wardle.example.com", "flunders", name="f", ns="team"))
    assert (
        allowed.reason == 'RBAC: allowed by RoleBinding "alice-reads/team" of Role "reader" to User "alice"'
    )
    for ns in ("default", ""):
        assert (
            p.authorize(ALICE, res("get", "wardle.example.com", "flunders", ns=ns)).decision
            is Decision.NO_OPINION
        )


def test_service_account_subjects_match_their_user_name_and_default_to_the_bindings_namespace() -> None:
    robot = {"kind": "ServiceAccount", "name": "robot"}
    p = policy(
        manifest("Role", "reader", "team", rules=[READ_FLUNDERS]),
        binding("RoleBinding", "robot-reads", "Role", "reader", robot, namespace="team"),
        manifest(
            "ClusterRole", "lister", rules=[{"verbs": ["list"], "apiGroups": ["*"], "resources": ["*"]}]
        ),
        binding("ClusterRoleBinding", "robot-lists", "ClusterRole", "lister", {**robot, "namespace": "team"}),
    )
    assert p.authorize(SA, res("get", "wardle.example.com", "flunders", ns="team")).reason == (
        'RBAC: allowed by RoleBinding "robot-reads/team" of Role "reader" to ServiceAccount "robot/team"'
    )
    assert p.authorize(SA, res("list", "x", "y")).reason == (
        'RBAC: allowed by ClusterRoleBinding "robot-lists" of ClusterRole "lister" to ServiceAccount "robot/team"'
    )
    impostor = UserInfo("system:serviceaccount:other:robot")
    assert p.authorize(impostor, res("list", "x", "y")).decision is Decision.NO_OPINION


def test_the_first_binding_by_name_and_its_first_matching_subject_are_the_reason() -> None:
    """Bindings are looked up by the users and groups they name, yet visited in upstream's order:
    ClusterRoleBindings, then the namespace's RoleBindings, each by name."""
    lister = manifest(
        "ClusterRole", "lister", rules=[{"verbs": ["list"], "apiGroups": ["*"], "resources": ["*"]}]
    )
    p = policy(
        lister,
        binding("ClusterRoleBinding", "b-by-user", "ClusterRole", "lister", user("alice")),
        binding(
            "ClusterRoleBinding",
            "a-by-group",
            "ClusterRole",
            "lister",
            user("carol"),
            group("devs"),
            user("alice"),
        ),
        binding("RoleBinding", "0-local", "ClusterRole", "lister", user("alice"), namespace="team"),
    )
    assert p.authorize(ALICE, res("list", "g", "r", ns="team")).reason == (
        'RBAC: allowed by ClusterRoleBinding "a-by-group" of ClusterRole "lister" to Group "devs"'
    )
    rules = p.rules_for(ALICE, "team").rules
    assert rules.count(PolicyRule(("list",), ("*",), ("*",))) == 3  # one per binding that applies


def test_a_binding_to_a_missing_role_is_the_reason_of_the_refusal_but_takes_nothing_away() -> None:
    p = policy(
        binding("ClusterRoleBinding", "a", "ClusterRole", "gone", user("alice")),
        binding("RoleBinding", "b", "Role", "gone-too", user("alice"), namespace="team"),
        manifest(
            "ClusterRole", "lister", rules=[{"verbs": ["list"], "apiGroups": ["*"], "resources": ["*"]}]
        ),
        binding("ClusterRoleBinding", "c", "ClusterRole", "lister", user("alice")),
    )
    refused = p.authorize(ALICE, res("delete", "g", "r", ns="team"))
    assert refused.decision is Decision.NO_OPINION
    assert refused.reason == (
        'RBAC: [clusterrole.rbac.authorization.k8s.io "gone" not found, '
        'role.rbac.authorization.k8s.io "gone-too" not found]'
    )
    assert p.authorize(ALICE, res("list", "g", "r", ns="team")).decision is Decision.ALLOW
    rules = p.rules_for(ALICE, "team")
    assert rules.error.startswith("[clusterrole.rbac.authorization.k8s.io")
    assert PolicyRule(("list",), ("*",), ("*",)) in rules.rules


@pytest.mark.parametrize(
    ("resource", "name", "allowed"),
    [
        ("users", "bob", True),
        ("users", "root", False),
        ("groups", "system:masters", False),
        ("groups", "devs", True),
    ],
)
def test_impersonation_is_a_verb_on_users_groups_serviceaccounts_and_uids(
    resource: str, name: str, allowed: bool
) -> None:
    p = policy(
        manifest(
            "ClusterRole",
            "impersonator",
            rules=[
                {
                    "verbs": ["impersonate"],
                    "apiGroups": [""],
                    "resources": ["users"],
                    "resourceNames": ["bob"],
                },
                {
                    "verbs": ["impersonate"],
                    "apiGroups": [""],
                    "resources": ["groups"],
                    "resourceNames": ["devs"],
                },
            ],
        ),
        binding("ClusterRoleBinding", "alice-impersonates", "ClusterRole", "impersonator", user("alice")),
    )
    verdict = p.authorize(ALICE, res("impersonate", "", resource, name=name))
    assert (verdict.decision is Decision.ALLOW) is allowed


def test_the_built_in_roles_let_every_authenticated_user_discover_and_ask() -> None:
    p = policy()
    for path in ("/apis", "/apis/wardle.example.com", "/api", "/version", "/openapi/v3", "/healthz"):
        assert p.authorize(ALICE, url("get", path)).decision is Decision.ALLOW, path
    ssar = res("create", "authorization.k8s.io", "selfsubjectaccessreviews")
    assert p.authorize(ALICE, ssar).reason == (
        'RBAC: allowed by ClusterRoleBinding "system:basic-user" of ClusterRole "system:basic-user" to Group '
        '"system:authenticated"'
    )
    assert p.authorize(ALICE, url("get", "/metrics")).decision is Decision.NO_OPINION
    assert p.authorize(ALICE, res("list", "wardle.example.com", "flunders")).decision is Decision.NO_OPINION
    masters = UserInfo("root", groups=("system:masters",))
    assert p.authorize(masters, res("delete", "any", "thing", ns="x")).decision is Decision.ALLOW
    anonymous = UserInfo("system:anonymous", groups=("system:unauthenticated",))
    assert p.authorize(anonymous, url("get", "/version")).decision is Decision.ALLOW
    assert p.authorize(anonymous, url("get", "/apis")).decision is Decision.NO_OPINION


def test_a_folder_role_replaces_its_built_in_namesake() -> None:
    p = policy(
        manifest(
            "ClusterRole", "system:discovery", rules=[{"verbs": ["get"], "nonResourceURLs": ["/version"]}]
        )
    )
    assert p.authorize(ALICE, url("get", "/apis")).decision is Decision.NO_OPINION
    assert p.authorize(ALICE, url("get", "/version")).decision is Decision.ALLOW


def test_aggregated_cluster_roles_gather_the_rules_of_the_roles_they_select() -> None:
    view_flunders = manifest(
        "ClusterRole",
        "wardle-view",
        labels={"rbac.authorization.k8s.io/aggregate-to-view": "true"},
        rules=[READ_FLUNDERS],
    )
    edit_flunders = manifest(
        "ClusterRole",
        "wardle-edit",
        labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"},
        rules=[
            {"verbs": ["create", "delete"], "apiGroups": ["wardle.example.com"], "resources": ["flunders"]}
        ],
    )
    mine = manifest(
        "ClusterRole",
        "mine",
        aggregationRule={
            "clusterRoleSelectors": [
                {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
            ]
        },
        rules=[{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],  # replaced by the aggregation
    )
    tagged = manifest(
        "ClusterRole", "tagged", labels={"team": "a"}, rules=[{"verbs": ["get"], "nonResourceURLs": ["/x"]}]
    )
    p = policy(
        view_flunders,
        edit_flunders,
        mine,
        tagged,
        binding("ClusterRoleBinding", "v", "ClusterRole", "view", user("viewer")),
        binding("ClusterRoleBinding", "a", "ClusterRole", "admin", user("admin")),
        binding("ClusterRoleBinding", "m", "ClusterRole", "mine", user("mine")),
    )
    # view <- wardle-view; edit <- view (labelled aggregate-to-edit) + wardle-edit; admin <- edit
    assert p.cluster_roles["view"] == (
        PolicyRule(("get", "list", "watch"), ("wardle.example.com",), ("flunders",)),
    )
    assert (
        p.authorize(UserInfo("viewer"), res("list", "wardle.example.com", "flunders")).decision
        is Decision.ALLOW
    )
    assert (
        p.authorize(UserInfo("viewer"), res("delete", "wardle.example.com", "flunders")).decision
        is Decision.NO_OPINION
    )
    assert (
        p.authorize(UserInfo("admin"), res("delete", "wardle.example.com", "flunders")).decision
        is Decision.ALLOW
    )
    assert (
        p.authorize(UserInfo("admin"), res("watch", "wardle.example.com", "flunders")).decision
        is Decision.ALLOW
    )
    assert p.cluster_roles["mine"] == (PolicyRule(("get",), non_resource_urls=("/x",)),)
    assert p.authorize(UserInfo("mine"), res("get", "g", "r")).decision is Decision.NO_OPINION


# --- validation: kube-apiserver's messages -----------------------------------------------------------

REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "no verbs": (
        manifest("ClusterRole", "r", rules=[{"apiGroups": [""], "resources": ["pods"]}]),
        'ClusterRole.rbac.authorization.k8s.io "r" is invalid: rules[0].verbs: Required value: verbs must contain '
        "at least one value",
    ),
    "no api groups nor resources": (
        manifest("Role", "r", "team", rules=[{"verbs": ["get"]}]),
        'Role.rbac.authorization.k8s.io "r" is invalid: [rules[0].apiGroups: Required value: resource rules must '
        "supply at least one api group, rules[0].resources: Required value: resource rules must supply at least "
        "one resource]",
    ),
    "urls in a namespaced role": (
        manifest("Role", "r", "team", rules=[{"verbs": ["get"], "nonResourceURLs": ["/x"]}]),
        'Role.rbac.authorization.k8s.io "r" is invalid: rules[0].nonResourceURLs: Invalid value: []string{"/x"}: '
        "namespaced rules cannot apply to non-resource URLs",
    ),
    "urls and resources": (
        manifest(
            "ClusterRole", "r", rules=[{"verbs": ["get"], "nonResourceURLs": ["/x"], "resources": ["pods"]}]
        ),
        'ClusterRole.rbac.authorization.k8s.io "r" is invalid: rules[0].nonResourceURLs: Invalid value: '
        '[]string{"/x"}: rules cannot apply to both regular resources and non-resource URLs',
    ),
    "a role kind a cluster binding cannot use": (
        binding("ClusterRoleBinding", "b", "Role", "r", user("alice")),
        'ClusterRoleBinding.rbac.authorization.k8s.io "b" is invalid: roleRef.kind: Unsupported value: "Role": '
        'supported values: "ClusterRole"',
    ),
    "a subject kind": (
        binding("ClusterRoleBinding", "b", "ClusterRole", "r", {"kind": "Robot", "name": "x"}),
        'ClusterRoleBinding.rbac.authorization.k8s.io "b" is invalid: subjects[0].kind: Unsupported value: "Robot": '
        'supported values: "ServiceAccount", "User", "Group"',
    ),
    "a service account without a namespace in a cluster binding": (
        binding("ClusterRoleBinding", "b", "ClusterRole", "r", {"kind": "ServiceAccount", "name": "robot"}),
        'ClusterRoleBinding.rbac.authorization.k8s.io "b" is invalid: subjects[0].namespace: Required value',
    ),
    "a user with another api group": (
        binding(
            "RoleBinding",
            "b",
            "ClusterRole",
            "r",
            {"kind": "User", "name": "x", "apiGroup": "v1"},
            namespace="n",
        ),
        'RoleBinding.rbac.authorization.k8s.io "b" is invalid: subjects[0].apiGroup: Unsupported value: "v1": '
        'supported values: "rbac.authorization.k8s.io"',
    ),
    "a name with a slash": (
        manifest("ClusterRole", "a/b", rules=[]),
        'ClusterRole.rbac.authorization.k8s.io "a/b" is invalid: metadata.name: Invalid value: "a/b": may not contain \'/\'',
    ),
    "an empty aggregation rule": (
        manifest("ClusterRole", "r", aggregationRule={}),
        'ClusterRole.rbac.authorization.k8s.io "r" is invalid: aggregationRule.clusterRoleSelectors: Required value: '
        "at least one clusterRoleSelector required if aggregationRule is non-nil",
    ),
    "a wrong type": (
        manifest("ClusterRole", "r", rules=[{"verbs": "get"}]),
        'ClusterRole.rbac.authorization.k8s.io "r" could not be decoded: rules[0].verbs: expected array, got str',
    ),
    "a removed version": (
        {**manifest("ClusterRole", "r"), "apiVersion": "rbac.authorization.k8s.io/v1beta1"},
        "rbac.authorization.k8s.io/v1beta1 ClusterRole is not served (removed in Kubernetes 1.22); use "
        "rbac.authorization.k8s.io/v1",
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_manifests_kube_apiserver_would_refuse_are_refused_with_its_message(case: str) -> None:
    doc, message = REFUSALS[case]
    with pytest.raises(Refused) as refused:
        decode(doc)
    assert str(refused.value) == message


def test_defaults_as_kube_apiserver_applies_them() -> None:
    role = decode(manifest("Role", "r", rules=[]))
    assert (role.kind, role.namespace) == ("Role", "default")
    cluster_role = decode(manifest("ClusterRole", "r", "ignored"))
    assert cluster_role.namespace == ""
    bound = decode(
        {
            "apiVersion": V1,
            "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "n"},
            "roleRef": {"kind": "Role", "name": "r"},  # apiGroup defaulted
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "sa"}],
        }
    )
    assert p_subjects(bound) == [("User", "u", ""), ("ServiceAccount", "sa", "")]


def p_subjects(obj: object) -> list[tuple[str, str, str]]:
    return [(s.kind, s.name, s.namespace) for s in getattr(obj, "subjects", ())]
