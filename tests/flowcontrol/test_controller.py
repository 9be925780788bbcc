"""The configuration in force: limits per priority level, borrowing, and which FlowSchema a request
matches (apf_controller.go, rule.go)."""

from __future__ import annotations

import hashlib
from typing import Any

from aggregator.flowcontrol import bootstrap
from aggregator.flowcontrol.controller import Controller, go_round, hash_flow
from aggregator.flowcontrol.integrator import IntegratorResults
from aggregator.flowcontrol.manifests import decode_manifest
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.flowcontrol.objects import FlowSchema, PriorityLevel
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo, new_request_info
from tests.flowcontrol.support import flow_schema, priority_level

AUTHENTICATED = ("system:authenticated",)

# What a real kube-apiserver 1.32 (the default --max-requests-inflight 400 and
# --max-mutating-requests-inflight 200, the bootstrap configuration, no load yet) reported in
# apiserver_flowcontrol_{nominal,lower,upper,current}_limit_seats: /work/realk8s, read 2026-11-28.
KUBE_APISERVER_600 = {
    "catch-all": (13, 13, 613, 30),
    "global-default": (49, 24, 649, 56),
    "leader-election": (25, 25, 625, 58),
    "node-high": (98, 73, 698, 170),
    "system": (74, 50, 674, 117),
    "workload-high": (98, 49, 698, 114),
    "workload-low": (245, 24, 845, 56),
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(limit: int, clock: FakeClock | None = None) -> Controller:
    c = Controller(limit, FlowControlMetrics(None), clock=clock or FakeClock(), call_later=lambda _d, _f: None)
    levels, schemas = bootstrap.ensure((), ())
    c.digest(levels, schemas)
    return c


def info(method: str, path: str) -> RequestInfo:
    return new_request_info(method, path, {})


def test_the_limits_are_the_ones_kube_apiserver_computes() -> None:
    c = controller(600)
    for name, expected in KUBE_APISERVER_600.items():
        level = c.levels[name]
        assert (level.nominal, level.min_cl, level.max_cl, level.current_cl) == expected, name
    assert c.metrics.fair_frac == 602 / 258  # upstream's seat_fair_frac: 2.3333333333333335


def test_a_small_server_limit_leaves_the_levels_that_may_lend_everything_without_seats_until_demand() -> None:
    """With 4 seats (the issue's --max-requests-inflight 3 --max-mutating-requests-inflight 1) the
    levels that lend half or more of a single nominal seat start at 0, as upstream; the borrowing
    adjustment gives them seats once they have demand."""
    clock = FakeClock()
    c = controller(4, clock)
    gd = c.levels["global-default"]
    assert (gd.nominal, gd.min_cl, gd.max_cl, gd.current_cl) == (1, 0, 5, 0)
    assert c.nominal_cl_sum == 8
    demand = IntegratorResults(10.0, 30.0, 2.0, 0.0, 33.0)
    clock.now += 10
    c.update_borrowing(demand={"global-default": demand})
    assert c.levels["global-default"].current_cl == 4  # its target (32 seats) against the idle levels' floors
    assert c.levels["global-default"].queues.concurrency_limit == 4


def test_go_rounding_is_half_away_from_zero() -> None:
    assert [go_round(x) for x in (0.5, 1.5, 2.5, -0.5, 0.49999, 1.8)] == [1, 2, 3, -1, 0, 2]


def test_the_first_matching_schema_by_precedence_then_name_wins() -> None:
    c = controller(600)
    tenants = decode_manifest(priority_level("tenants"))
    a = decode_manifest(flow_schema("b-tenants", "tenants", precedence=700, users=("alice",)))
    b = decode_manifest(flow_schema("a-tenants", "tenants", precedence=700, users=("alice",)))
    levels, schemas = bootstrap.ensure([tenants], [a, b])  # type: ignore[list-item]
    c.digest(levels, schemas)
    alice = UserInfo("alice", groups=AUTHENTICATED)
    assert c.classify(alice, info("GET", "/apis/x.io/v1/things")).name == "a-tenants"
    assert c.classify(UserInfo("bob", groups=AUTHENTICATED), info("GET", "/apis/x.io/v1/things")).name == "global-default"
    assert c.classify(UserInfo("root", groups=("system:masters", *AUTHENTICATED)), info("DELETE", "/apis/x.io/v1/things/a")).name == "exempt"
    # an anonymous /healthz: probes; a node: system-nodes; a service account: service-accounts
    anonymous = UserInfo("system:anonymous", groups=("system:unauthenticated",))
    assert c.classify(anonymous, info("GET", "/healthz")).name == "probes"
    assert c.classify(anonymous, info("GET", "/healthz/etcd")).name == "probes"  # a URL matches below it
    assert c.classify(anonymous, info("GET", "/version")).name == "global-default"
    node = UserInfo("system:node:n1", groups=("system:nodes", *AUTHENTICATED))
    assert c.classify(node, info("PUT", "/api/v1/nodes/n1/status")).name == "system-node-high"
    assert c.classify(node, info("GET", "/api/v1/pods")).name == "system-nodes"
    account = UserInfo("system:serviceaccount:team:ci", groups=("system:serviceaccounts", "system:serviceaccounts:team", *AUTHENTICATED))
    assert c.classify(account, info("GET", "/apis/x.io/v1/things")).name == "service-accounts"
    kube_system = UserInfo("system:serviceaccount:kube-system:job", groups=("system:serviceaccounts", *AUTHENTICATED))
    leases = info("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x")
    assert c.classify(kube_system, leases).name == "system-leader-election"
    configmaps = info("PUT", "/api/v1/namespaces/kube-system/configmaps/x")
    assert c.classify(kube_system, configmaps).name == "workload-leader-election"
    assert c.classify(kube_system, info("GET", "/api/v1/pods")).name == "kube-system-service-accounts"


def test_rules_match_verbs_groups_resources_namespaces_and_urls_as_upstream() -> None:
    rules: list[dict[str, Any]] = [
        {"verbs": ["get", "list"], "apiGroups": ["x.io"], "resources": ["things", "things/status"], "namespaces": ["team"]},
        {"verbs": ["create"], "apiGroups": [""], "resources": ["*"], "clusterScope": True},
    ]
    schema = decode_manifest(
        flow_schema("narrow", "tenants", users=("*",), resource_rules=rules, non_resource_rules=[{"verbs": ["get"], "nonResourceURLs": ["/metrics", "/logs/*"]}])
    )
    assert isinstance(schema, FlowSchema)
    tenants = decode_manifest(priority_level("tenants"))
    assert isinstance(tenants, PriorityLevel)
    c = controller(600)
    levels, schemas = bootstrap.ensure([tenants], [schema])
    c.digest(levels, schemas)
    user = UserInfo("carol", groups=AUTHENTICATED)

    def matched(method: str, path: str) -> bool:
        return c.classify(user, info(method, path)).name == "narrow"

    assert matched("GET", "/apis/x.io/v1/namespaces/team/things")
    assert matched("GET", "/apis/x.io/v1/namespaces/team/things/a/status")
    assert not matched("GET", "/apis/x.io/v1/namespaces/team/things/a/scale")  # not a listed subresource
    assert not matched("GET", "/apis/x.io/v1/namespaces/other/things")
    assert not matched("GET", "/apis/x.io/v1/things")  # cluster scope not allowed by that rule
    assert not matched("PUT", "/apis/x.io/v1/namespaces/team/things/a")
    assert matched("POST", "/api/v1/namespaces")  # the core group, cluster-scoped create
    assert not matched("POST", "/api/v1/namespaces/team/configmaps")  # namespaced: no namespaces listed
    assert matched("GET", "/metrics") and matched("GET", "/metrics/extra")  # any URL matches below it
    assert matched("GET", "/logs/kube-apiserver.log") and not matched("GET", "/logs")
    assert not matched("POST", "/metrics")


def test_flows_are_distinguished_by_user_or_namespace_with_upstreams_hash() -> None:
    c = controller(600)
    alice = UserInfo("alice", groups=AUTHENTICATED)
    schema = c.classify(alice, info("GET", "/apis/x.io/v1/namespaces/a/things"))
    assert schema.distinguisher(alice, info("GET", "/")) == "alice"
    assert schema.flow(alice, info("GET", "/")) == hash_flow("global-default", "alice")
    # sha256("global-default\x00alice")'s first eight bytes, little-endian (hashFlowID)
    digest = hashlib.sha256(b"global-default\x00alice").digest()
    assert hash_flow("global-default", "alice") == int.from_bytes(digest[:8], "little")
    controller_manager = UserInfo("system:kube-controller-manager", groups=AUTHENTICATED)
    kcm = c.classify(controller_manager, info("GET", "/api/v1/namespaces/team/pods"))
    assert kcm.name == "kube-controller-manager"
    assert kcm.distinguisher(controller_manager, info("GET", "/api/v1/namespaces/team/pods")) == "team"
    assert kcm.flow(controller_manager, info("GET", "/api/v1/namespaces/team/pods")) == hash_flow(
        "kube-controller-manager", "team"
    )
    assert kcm.distinguisher(controller_manager, info("GET", "/api/v1/pods")) == ""


def test_a_schema_whose_level_is_missing_is_ignored_and_the_mandatory_ones_are_always_there() -> None:
    c = controller(600)
    orphan = decode_manifest(flow_schema("orphan", "nowhere", precedence=100, users=("alice",)))
    c.digest([], [orphan])  # type: ignore[list-item]
    assert [s.name for s in c.schemas] == ["exempt", "catch-all"]
    alice = UserInfo("alice", groups=AUTHENTICATED)
    assert c.classify(alice, info("GET", "/apis/x.io/v1/things")).name == "catch-all"
