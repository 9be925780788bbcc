"""The audit policy: reading kube-apiserver's file format and matching requests like `checker.go`."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from aggregator.audit.policy import (
    GroupResources,
    Level,
    Policy,
    PolicyError,
    PolicyRule,
    RequestAuditConfig,
    Stage,
    load_policy_file,
    parse_policy,
)
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo, new_request_info

TIM = UserInfo("tim@k8s.io", groups=("humans", "developers"))

# The requests of upstream's checker_test.go.
REQUESTS = {
    "namespaced": RequestInfo(
        True,
        "/api/v1/namespaces/default/pods/busybox",
        "get",
        api_version="v1",
        namespace="default",
        resource="pods",
        name="busybox",
    ),
    "cluster": RequestInfo(
        True,
        "/apis/rbac.authorization.k8s.io/v1beta1/clusterroles/edit",
        "get",
        api_group="rbac.authorization.k8s.io",
        api_version="v1beta1",
        resource="clusterroles",
        name="edit",
    ),
    "nonResource": RequestInfo(False, "/logs/kubelet.log", "get"),
    "subresource": RequestInfo(
        True,
        "/api/v1/namespaces/default/pods/busybox/log",
        "get",
        api_version="v1",
        namespace="default",
        resource="pods",
        subresource="log",
        name="busybox",
    ),
    "clusterRoleUpdate": RequestInfo(
        True,
        "/apis/rbac.authorization.k8s.io/v1beta1/clusterroles/somerole/status",
        "update",
        api_group="rbac.authorization.k8s.io",
        api_version="v1beta1",
        resource="clusterroles",
        subresource="status",
        name="somerole",
    ),
}

RULES = {
    "default": PolicyRule(Level.METADATA),
    "create": PolicyRule(Level.REQUEST, verbs=("create",)),
    "tims": PolicyRule(Level.METADATA, users=("tim@k8s.io",)),
    "humans": PolicyRule(Level.METADATA, user_groups=("humans",)),
    "serviceAccounts": PolicyRule(Level.REQUEST, user_groups=("system:serviceaccounts",)),
    "getPods": PolicyRule(Level.REQUEST_RESPONSE, verbs=("get",), resources=(GroupResources("", ("pods",)),)),
    "getPodLogs": PolicyRule(Level.REQUEST, verbs=("get",), resources=(GroupResources("", ("pods/log",)),)),
    "getPodWildcardMatching": PolicyRule(
        Level.REQUEST, verbs=("get",), resources=(GroupResources("", ("*",)),)
    ),
    "getPodResourceWildcardMatching": PolicyRule(
        Level.REQUEST, verbs=("get",), resources=(GroupResources("", ("*/log",)),)
    ),
    "getPodSubResourceWildcardMatching": PolicyRule(
        Level.REQUEST, verbs=("get",), resources=(GroupResources("", ("pods/*",)),)
    ),
    "getClusterRoles": PolicyRule(
        Level.REQUEST_RESPONSE,
        verbs=("get",),
        resources=(GroupResources("rbac.authorization.k8s.io", ("clusterroles",)),),
        namespaces=("",),
    ),
    "groupWildcardStatus": PolicyRule(
        Level.REQUEST_RESPONSE, verbs=("update",), resources=(GroupResources("*", ("*/status",)),)
    ),
    "getLogs": PolicyRule(Level.REQUEST_RESPONSE, verbs=("get",), non_resource_urls=("/logs*",)),
    "getMetrics": PolicyRule(Level.REQUEST, verbs=("get",), non_resource_urls=("/metrics",)),
    "clusterRoleEdit": PolicyRule(
        Level.REQUEST,
        resources=(GroupResources("rbac.authorization.k8s.io", ("clusterroles",), ("edit",)),),
    ),
}

L = Level
CASES = [
    ("namespaced", L.METADATA, ["default"]),
    ("namespaced", L.NONE, ["create"]),
    ("namespaced", L.METADATA, ["tims"]),
    ("namespaced", L.METADATA, ["humans"]),
    ("namespaced", L.NONE, ["serviceAccounts"]),
    ("namespaced", L.REQUEST_RESPONSE, ["getPods"]),
    ("namespaced", L.NONE, ["getClusterRoles"]),
    ("namespaced", L.NONE, ["getLogs"]),
    ("namespaced", L.NONE, ["getMetrics"]),
    ("namespaced", L.METADATA, ["getMetrics", "serviceAccounts", "default"]),
    ("namespaced", L.REQUEST_RESPONSE, ["getMetrics", "getPods", "default"]),
    ("namespaced", L.REQUEST_RESPONSE, ["getPodLogs", "getPods"]),
    ("cluster", L.METADATA, ["default"]),
    ("cluster", L.NONE, ["create"]),
    ("cluster", L.METADATA, ["tims"]),
    ("cluster", L.METADATA, ["humans"]),
    ("cluster", L.NONE, ["serviceAccounts"]),
    ("cluster", L.NONE, ["getPods"]),
    ("cluster", L.REQUEST_RESPONSE, ["getClusterRoles"]),
    ("cluster", L.REQUEST, ["clusterRoleEdit", "getClusterRoles"]),
    ("cluster", L.NONE, ["getLogs"]),
    ("cluster", L.NONE, ["getMetrics"]),
    ("cluster", L.METADATA, ["getMetrics", "serviceAccounts", "default"]),
    ("cluster", L.REQUEST_RESPONSE, ["getMetrics", "getClusterRoles", "default"]),
    ("cluster", L.NONE, ["getPodLogs", "getPods"]),
    ("nonResource", L.METADATA, ["default"]),
    ("nonResource", L.NONE, ["create"]),
    ("nonResource", L.METADATA, ["tims"]),
    ("nonResource", L.METADATA, ["humans"]),
    ("nonResource", L.NONE, ["serviceAccounts"]),
    ("nonResource", L.NONE, ["getPods"]),
    ("nonResource", L.NONE, ["getClusterRoles"]),
    ("nonResource", L.REQUEST_RESPONSE, ["getLogs"]),
    ("nonResource", L.NONE, ["getMetrics"]),
    ("nonResource", L.METADATA, ["getMetrics", "serviceAccounts", "default"]),
    ("nonResource", L.REQUEST_RESPONSE, ["getLogs", "getClusterRoles", "default"]),
    ("nonResource", L.NONE, ["getPodLogs", "getPods"]),
    ("subresource", L.REQUEST, ["getPodLogs", "getPods"]),
    ("subresource", L.REQUEST, ["getPodWildcardMatching"]),
    ("subresource", L.REQUEST, ["getPodResourceWildcardMatching"]),
    ("subresource", L.REQUEST, ["getPodSubResourceWildcardMatching"]),
    ("subresource", L.NONE, ["getPods"]),  # `pods` does not match `pods/log`
    ("clusterRoleUpdate", L.REQUEST_RESPONSE, ["groupWildcardStatus"]),
    ("namespaced", L.NONE, ["groupWildcardStatus"]),
]


@pytest.mark.parametrize(("request_name", "level", "rule_names"), CASES)
def test_upstream_checker_table(request_name: str, level: Level, rule_names: list[str]) -> None:
    policy = Policy(tuple(RULES[name] for name in rule_names))
    assert policy.evaluate(TIM, REQUESTS[request_name]).level is level


def test_unauthenticated_user_matches_no_user_or_group_rule() -> None:
    policy = Policy((RULES["tims"], RULES["humans"]))
    assert policy.evaluate(None, REQUESTS["namespaced"]).level is Level.NONE


def info(method: str, path: str) -> RequestInfo:
    target, _, query = path.partition("?")
    params: dict[str, list[str]] = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        params.setdefault(key, []).append(value)
    return new_request_info(method, target, params)


def rule(**kwargs: Any) -> Policy:
    return Policy((PolicyRule(Level.METADATA, **kwargs),))


@pytest.mark.parametrize(
    ("policy", "method", "path", "audited"),
    [
        # resources: `res`, `res/sub`, `*`, `*/sub`, `res/*` (the resource itself too), resourceNames
        (rule(resources=(GroupResources("", ("pods",)),)), "GET", "/api/v1/namespaces/a/pods", True),
        (rule(resources=(GroupResources("", ("pods",)),)), "GET", "/api/v1/namespaces/a/pods/p/log", False),
        (
            rule(resources=(GroupResources("", ("pods/log",)),)),
            "GET",
            "/api/v1/namespaces/a/pods/p/log",
            True,
        ),
        (rule(resources=(GroupResources("", ("pods/*",)),)), "GET", "/api/v1/namespaces/a/pods/p", True),
        (rule(resources=(GroupResources("", ("pods/*",)),)), "GET", "/api/v1/namespaces/a/pods/p/exec", True),
        (rule(resources=(GroupResources("", ("*/exec",)),)), "GET", "/api/v1/namespaces/a/pods/p/exec", True),
        (rule(resources=(GroupResources("", ("*/exec",)),)), "GET", "/api/v1/namespaces/a/pods/p", False),
        (rule(resources=(GroupResources("", ("*",)),)), "GET", "/api/v1/nodes/n/status", True),
        (
            rule(resources=(GroupResources("", ("pods",), ("p",)),)),
            "GET",
            "/api/v1/namespaces/a/pods/p",
            True,
        ),
        (
            rule(resources=(GroupResources("", ("pods",), ("p",)),)),
            "GET",
            "/api/v1/namespaces/a/pods/q",
            False,
        ),
        (rule(resources=(GroupResources("", ("pods",), ("p",)),)), "GET", "/api/v1/namespaces/a/pods", False),
        # group: "" is core, a named group, "*" any, no resources = the whole group
        (
            rule(
                resources=(
                    GroupResources(
                        "",
                    ),
                )
            ),
            "GET",
            "/apis/apps/v1/deployments",
            False,
        ),
        (
            rule(
                resources=(
                    GroupResources(
                        "apps",
                    ),
                )
            ),
            "GET",
            "/apis/apps/v1/deployments",
            True,
        ),
        (rule(resources=(GroupResources("*", ("deployments",)),)), "GET", "/apis/apps/v1/deployments", True),
        (
            rule(
                resources=(
                    GroupResources(
                        "apps",
                    ),
                )
            ),
            "GET",
            "/apis/apps/v1",
            False,
        ),  # discovery: non-resource
        # namespaces: "" is cluster scope; never matches non-resource requests
        (rule(namespaces=("",)), "GET", "/api/v1/nodes", True),
        (rule(namespaces=("",)), "GET", "/api/v1/namespaces/a/pods", False),
        (rule(namespaces=("a",)), "GET", "/api/v1/namespaces/a/pods", True),
        (rule(namespaces=("a",)), "GET", "/healthz", False),
        # nonResourceURLs: `*`, exact, trailing-* prefix; never resource requests
        (rule(non_resource_urls=("*",)), "GET", "/healthz", True),
        (rule(non_resource_urls=("*",)), "GET", "/api/v1/pods", False),
        (rule(non_resource_urls=("/healthz",)), "GET", "/healthz", True),
        (rule(non_resource_urls=("/healthz",)), "GET", "/healthz/ping", False),
        (rule(non_resource_urls=("/healthz*",)), "GET", "/healthz/ping", True),
        (rule(non_resource_urls=("/apis*",)), "GET", "/apis", True),
        # verbs are RequestInfo's: list, watch, deletecollection, lower-case methods for paths
        (rule(verbs=("watch",)), "GET", "/api/v1/pods?watch=true", True),
        (rule(verbs=("list",)), "GET", "/api/v1/pods?watch=true", False),
        (rule(verbs=("deletecollection",)), "DELETE", "/api/v1/namespaces/a/pods", True),
        (rule(verbs=("post",)), "POST", "/version", True),
        # users and userGroups
        (rule(users=("tim@k8s.io",)), "GET", "/healthz", True),
        (rule(users=("bob",)), "GET", "/healthz", False),
        (rule(user_groups=("developers", "x")), "GET", "/healthz", True),
        (rule(user_groups=("x",)), "GET", "/healthz", False),
    ],
)
def test_matchers(policy: Policy, method: str, path: str, audited: bool) -> None:
    expected = Level.METADATA if audited else Level.NONE
    assert policy.evaluate(TIM, info(method, path)).level is expected


POLICY = """
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
omitManagedFields: true
rules:
  - level: None
    users: ["system:kube-proxy"]
  - level: RequestResponse
    resources:
      - group: "wardle.example.com"
        resources: ["flunders"]
    omitManagedFields: false
  - level: Request
    verbs: ["create"]
    omitStages: ["Panic"]
  - level: Metadata
"""


def test_first_match_wins_and_stages_are_unioned() -> None:
    policy = parse_policy(POLICY)
    assert policy.evaluate(UserInfo("system:kube-proxy"), info("POST", "/api/v1/namespaces/a/pods")) == (
        RequestAuditConfig(Level.NONE, frozenset({Stage.REQUEST_RECEIVED}), True)
    )
    flunders = info("POST", "/apis/wardle.example.com/v1alpha1/namespaces/a/flunders")
    assert policy.evaluate(TIM, flunders) == RequestAuditConfig(
        Level.REQUEST_RESPONSE, frozenset({Stage.REQUEST_RECEIVED}), False
    )
    assert policy.evaluate(TIM, info("POST", "/api/v1/namespaces/a/pods")) == RequestAuditConfig(
        Level.REQUEST, frozenset({Stage.REQUEST_RECEIVED, Stage.PANIC}), True
    )
    assert policy.evaluate(TIM, info("GET", "/healthz")).level is Level.METADATA


def test_no_match_is_none_with_the_policy_defaults() -> None:
    policy = parse_policy(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Panic]\nrules:\n- level: Metadata\n  users: [x]\n"
    )
    assert policy.evaluate(TIM, info("GET", "/healthz")) == RequestAuditConfig(
        Level.NONE, frozenset({Stage.PANIC}), False
    )


def test_json_policy_is_read_too() -> None:
    policy = parse_policy('{"apiVersion":"audit.k8s.io/v1","kind":"Policy","rules":[{"level":"Request"}]}')
    assert policy.evaluate(TIM, info("GET", "/x")).level is Level.REQUEST


HEADER = "apiVersion: audit.k8s.io/v1\nkind: Policy\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            HEADER + "rules:\n- level: Foo\n",
            'rules[0].level: Unsupported value: "Foo": supported values: '
            '"None", "Metadata", "Request", "RequestResponse"',
        ),
        (HEADER + "rules:\n- users: [a]\n", "rules[0].level: Required value"),
        (
            HEADER + "rules:\n- level: None\n  nonResourceURLs: [healthz]\n",
            "rules[0].nonResourceURLs[0]: Invalid value: \"healthz\": non-resource URL rules must begin with a '/' "
            "character",
        ),
        (
            HEADER + "rules:\n- level: None\n  nonResourceURLs: ['/a*b']\n",
            "rules[0].nonResourceURLs[0]: Invalid value: \"/a*b\": non-resource URL wildcards '*' must be the final "
            "character of the rule",
        ),
        (
            HEADER + "rules:\n- level: None\n  nonResourceURLs: [/a]\n  namespaces: [b]\n",
            'rules[0].nonResourceURLs: Invalid value: []string{"/a"}: rules cannot apply to both regular resources '
            "and non-resource URLs",
        ),
        (
            HEADER + "rules:\n- level: None\n  resources: [{group: Apps}]\n",
            'rules[0].resources.group: Invalid value: "Apps": a lowercase RFC 1123 subdomain must consist of',
        ),
        (
            HEADER + "rules:\n- level: None\n  resources: [{resourceNames: [x]}]\n",
            'rules[0].resources.resourceNames: Invalid value: []string{"x"}: using resourceNames requires at '
            "least one resource",
        ),
        (
            HEADER + "omitStages: [Sometime]\nrules:\n- level: None\n",
            'omitStages[0]: Invalid value: "Sometime": allowed stages are '
            "RequestReceived,ResponseStarted,ResponseComplete,Panic",
        ),
        (HEADER + "rules:\n- level: Foo\n- level: Bar\n", '[rules[0].level: Unsupported value: "Foo"'),
        (HEADER + "rules: []\n", "loaded illegal policy with 0 rules"),
        (HEADER, "loaded illegal policy with 0 rules"),
        (
            "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules:\n- level: None\n",
            "unknown group version 'audit.k8s.io/v1beta1' in policy",
        ),
        (
            "apiVersion: audit.k8s.io/v1\nkind: Other\nrules:\n- level: None\n",
            'no kind "Other" is registered for version "audit.k8s.io/v1"',
        ),
        ("kind: Policy\nrules:\n- level: None\n", "failed decoding: Object 'apiVersion' is missing"),
        (
            HEADER + "rules:\n- level: None\n  users: bob\n",
            "failed decoding: rules[0].users: expected a list",
        ),
        (HEADER + "rules: {level: None}\n", "failed decoding: rules: expected a list"),
        ("rules: [\n", "failed decoding: while parsing"),
        ("- a\n", "failed decoding: the document: expected an object"),
    ],
)
def test_bad_policies_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_unknown_fields_only_warn(caplog: pytest.LogCaptureFixture) -> None:
    """Upstream falls back to lenient decoding and logs the strict decoder's complaint."""
    with caplog.at_level(logging.WARNING):
        policy = parse_policy(HEADER + "metadata: {name: p}\nrules:\n- level: Metadata\n  verb: [get]\n")
    assert policy.evaluate(TIM, info("POST", "/x")).level is Level.METADATA  # `verb` is not `verbs`
    assert "rules[0].verb" in caplog.text


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(HEADER + "rules: []\n")
    with pytest.raises(PolicyError, match=f"^{path}: loaded illegal policy with 0 rules$"):
        load_policy_file(str(path))
    with pytest.raises(PolicyError, match=f"^{tmp_path / 'missing.yaml'}: cannot read: No such file"):
        load_policy_file(str(tmp_path / "missing.yaml"))


def test_levels_are_ordered() -> None:
    assert Level.NONE.less(Level.METADATA)
    assert Level.METADATA.less(Level.REQUEST)
    assert Level.REQUEST.less(Level.REQUEST_RESPONSE)
    assert not Level.REQUEST_RESPONSE.less(Level.REQUEST)


def test_the_example_policy_in_the_docs() -> None:
    guide = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
    match = re.search(r"<!-- tested: example-policy -->\n```yaml\n(.*?)```", guide.read_text(), re.S)
    assert match, "docs/audit.md lost its example policy"
    policy = parse_policy(match[1])
    hpa = UserInfo("system:serviceaccount:kube-system:horizontal-pod-autoscaler")
    for user, method, path, level in (
        (TIM, "GET", "/readyz?verbose", Level.NONE),
        (TIM, "GET", "/healthz/etcd", Level.NONE),
        (hpa, "GET", "/apis/metrics.k8s.io/v1beta1/namespaces/a/pods", Level.NONE),
        (TIM, "GET", "/apis/metrics.k8s.io/v1beta1/namespaces/a/pods", Level.METADATA),
        (TIM, "GET", "/apis/wardle.example.com/v1alpha1", Level.METADATA),
        (TIM, "POST", "/api/v1/namespaces/a/secrets", Level.METADATA),
        (TIM, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", Level.METADATA),
        (TIM, "POST", "/apis/wardle.example.com/v1alpha1/namespaces/a/flunders", Level.REQUEST_RESPONSE),
        (TIM, "GET", "/apis/wardle.example.com/v1alpha1/namespaces/a/flunders", Level.METADATA),
    ):
        config = policy.evaluate(user, info(method, path))
        assert config.level is level, (method, path)
        assert config.omit_stages == frozenset({Stage.REQUEST_RECEIVED})
        assert config.omit_managed_fields
