"""The request context (`web/context.py`): each fact derived once, by upstream's rules.

Query parsing is checked against Go's own cases (net/url `url_test.go` `parseTests`, the
semicolon rule of Go 1.17 on); RequestInfo against a few of `requestinfo_test.go`'s (the full
table is `test_requestinfo.py`'s); the long-running verdict against kube-apiserver's
`BasicLongRunningRequestCheck` sets plus the gateway's upgrade rule.
"""

from __future__ import annotations

import asyncio

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.audit.recorder import AUDIT, AUDIT_ID, AUTHORIZATION_DECISION
from aggregator.web.context import Connection, RequestContext, is_long_running, is_upgrade_request
from aggregator.web.inflight import INFLIGHT_KIND
from aggregator.web.instrumentation import INSTRUMENTED_AS, instrument_as
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import Response
from tests.support.contexts import TEST_ROUTE, RecordedRequest, context_for


def headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


def built(method: str, target: str, **header_values: str) -> RequestContext:
    """A context built from a request head alone."""
    request = RecordedRequest(
        method, target, {k.replace("_", "-"): v for k, v in header_values.items()}, remote="192.0.2.7"
    )
    return RequestContext(request, lambda _path: TEST_ROUTE, 12.5)


# --- the head ------------------------------------------------------------------------------------


def test_the_head_is_kept_as_sent_and_the_path_decoded_as_go_does() -> None:
    ctx = built("GET", "/apis/wardle.example.com/v1alpha1/namespaces/a%2Fb/flunders?limit=5&x=%41")
    assert ctx.method == "GET"
    assert ctx.target == "/apis/wardle.example.com/v1alpha1/namespaces/a%2Fb/flunders?limit=5&x=%41"
    assert ctx.raw_path == "/apis/wardle.example.com/v1alpha1/namespaces/a%2Fb/flunders"
    assert ctx.path == "/apis/wardle.example.com/v1alpha1/namespaces/a/b/flunders"  # URL.Path
    assert ctx.raw_query == "limit=5&x=%41"
    assert ctx.query == {"limit": ["5"], "x": ["A"]}
    assert ctx.remote == "192.0.2.7"
    assert ctx.received == 12.5
    assert ctx.route is TEST_ROUTE


def test_a_malformed_path_escape_stays_as_sent() -> None:
    # Go refuses such a request before authorizing it; the context keeps what it got.
    assert built("GET", "/apis/a/v1/x%zz").path == "/apis/a/v1/x%zz"


def test_what_the_gates_learn_starts_empty() -> None:
    ctx = built("GET", "/apis/wardle.example.com/v1alpha1/flunders")
    assert (ctx.user, ctx.requester, ctx.status, ctx.handled) == (None, None, None, False)
    assert (ctx.deadline, ctx.watch_deadline, ctx.timed_out) == (None, False, False)
    # What features own starts unset too.
    for key in (AUDIT, AUDIT_ID, AUTHORIZATION_DECISION, INFLIGHT_KIND, INSTRUMENTED_AS):
        assert key.get(ctx) is None
    assert ctx.log_fields is None


def test_a_feature_keeps_its_own_facts_under_its_key() -> None:
    ctx = context_for("GET", "/openapi/v3")
    instrument_as(ctx, "openapi/v3", "")
    assert INSTRUMENTED_AS.get(ctx) == ("openapi/v3", "")
    ctx.add_log_field("endpoint", "10.0.0.1:443")
    assert ctx.log_fields == {"endpoint": "10.0.0.1:443"}


def test_the_request_and_the_context_are_the_same_facts() -> None:
    target = "/api/v1/namespaces/ns/pods?watch=1&pretty=0"
    ctx = context_for("GET", target, headers={"Content-Type": "application/json"})
    assert (ctx.method, ctx.target, ctx.raw_path, ctx.raw_query) == (
        "GET",
        target,
        "/api/v1/namespaces/ns/pods",
        "watch=1&pretty=0",
    )
    assert ctx.content_type == "application/json"
    assert ctx.request.on_head == ctx.head_going_out  # the protocol tells the context of heads


async def test_the_route_is_matched_on_the_decoded_path() -> None:
    seen: list[str] = []

    async def handler(ctx: RequestContext) -> Response:
        return Response(200)

    route = Route(handler, RouteKind.OWN, "decoded")

    def route_of(path: str) -> Route:
        seen.append(path)
        return route

    ctx = RequestContext(RecordedRequest("GET", "/apis/a%2Fb/v1"), route_of, 0.0)
    assert seen == ["/apis/a/b/v1"]
    assert ctx.route is route


def test_the_status_line_is_told_once() -> None:
    heard: list[tuple[int, CIMultiDict[str]]] = []
    request = RecordedRequest("GET", "/healthz")
    ctx = RequestContext(
        request,
        lambda _path: TEST_ROUTE,
        0.0,
        listeners=(lambda c, status, head: heard.append((status, head)),),
    )
    head: CIMultiDict[str] = CIMultiDict()
    ctx.head_going_out(503, head)
    ctx.head_going_out(200, CIMultiDict())  # a later write changes nothing
    assert heard == [(503, head)]
    assert ctx.status == 503


# --- the query: Go's URL.Query(), parsed once -----------------------------------------------------

# net/url url_test.go `parseTests` (query, the values Go's URL.Query() returns: pairs with a
# semicolon or a bad escape are dropped, the others kept in order).
GO_PARSE_TESTS: list[tuple[str, dict[str, list[str]]]] = [
    ("a=1", {"a": ["1"]}),
    ("a=1&b=2", {"a": ["1"], "b": ["2"]}),
    ("a=1&a=2&a=banana", {"a": ["1", "2", "banana"]}),
    ("ascii=%3Ckey%3A+0x90%3E", {"ascii": ["<key: 0x90>"]}),
    ("a=1;b=2", {}),
    ("a;b=1", {}),
    ("a=%3B", {"a": [";"]}),
    ("a%3Bb=1", {"a;b": ["1"]}),
    ("a=1&a=2;a=banana", {"a": ["1"]}),
    ("a;b&c=1", {"c": ["1"]}),
    ("a=1&b=2;a=3&c=4", {"a": ["1"], "c": ["4"]}),
    ("a=1&b=2;c=3", {"a": ["1"]}),
    (";", {}),
    ("a=1;", {}),
    ("a=1&;", {"a": ["1"]}),
    (";a=1&b=2", {"b": ["2"]}),
    ("a=1&b=2;", {"a": ["1"]}),
]

# More of Go's rules: empty pairs are skipped, a key without `=` has an empty value, `+` is a
# space, a bad escape drops only its own pair (url.ParseQuery's error, ignored by URL.Query()).
GO_QUERY_RULES: list[tuple[str, dict[str, list[str]]]] = [
    ("", {}),
    ("&&a=1&&", {"a": ["1"]}),
    ("a", {"a": [""]}),
    ("a=", {"a": [""]}),
    ("=1", {"": ["1"]}),
    ("a=x+y&b=x%2By", {"a": ["x y"], "b": ["x+y"]}),
    ("a=%zz&b=2", {"b": ["2"]}),
    ("a%=1&b=%4", {}),
    ("a=1=2", {"a": ["1=2"]}),
    ("k=%E2%9C%93", {"k": ["✓"]}),
]


@pytest.mark.parametrize(("raw_query", "expected"), GO_PARSE_TESTS + GO_QUERY_RULES)
def test_the_query_is_parsed_as_gos_url_query(raw_query: str, expected: dict[str, list[str]]) -> None:
    target = f"/apis/wardle.example.com/v1alpha1/flunders?{raw_query}" if raw_query else "/apis/x/v1/y"
    assert built("GET", target).query == expected


def test_the_query_is_parsed_once() -> None:
    ctx = built("GET", "/apis/wardle.example.com/v1alpha1/flunders?limit=1")
    first = ctx.query
    assert ctx.query is first
    # No query: nothing to parse, ever.
    assert built("GET", "/apis/wardle.example.com/v1alpha1/flunders").query == {}


@pytest.mark.parametrize(
    ("target", "user_agent", "pretty"),
    [
        ("/version?pretty=true", "", True),
        ("/version?pretty=1", "kubectl/v1.32", True),
        ("/version?pretty=0", "curl/8.0", False),  # the parameter wins over the agent
        ("/version?pretty=yes", "curl/8.0", False),  # not a Go bool: false
        ("/version?pretty=", "curl/8.0", True),  # empty: the agent decides
        ("/version", "curl/8.0", True),
        ("/version", "Wget/1.21", True),
        ("/version", "Mozilla/5.0 (X11)", True),
        ("/version", "kubectl/v1.32", False),
    ],
)
def test_pretty_follows_upstreams_rule(target: str, user_agent: str, pretty: bool) -> None:
    assert built("GET", target, User_Agent=user_agent).pretty is pretty


@pytest.mark.parametrize(
    ("method", "target", "watch", "dry_run"),
    [
        ("GET", "/api/v1/pods?watch=true", True, ""),
        ("GET", "/api/v1/pods?watch=0", False, ""),
        ("POST", "/api/v1/namespaces/n/pods?watch=1", False, ""),  # only GET watches
        ("POST", "/api/v1/namespaces/n/pods?dryRun=All", False, "All"),
        ("POST", "/api/v1/namespaces/n/pods?dryRun=%41ll", False, "All"),
        ("POST", "/api/v1/namespaces/n/pods?dryRun=bad", False, "invalid"),
        ("POST", "/api/v1/namespaces/n/pods", False, ""),
    ],
)
def test_the_metric_facts_read_the_parsed_query(method: str, target: str, watch: bool, dry_run: str) -> None:
    ctx = built(method, target)
    assert (ctx.watch, ctx.dry_run) == (watch, dry_run)


# --- RequestInfo ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        # requestinfo_test.go TestGetAPIRequestInfo, a few rows (the rest: test_requestinfo.py).
        (
            "GET",
            "/api/v1/namespaces/other/pods",
            ("list", "api", "", "v1", "other", "pods", "", "", ("pods",)),
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods/foo/status",
            ("get", "api", "", "v1", "other", "pods", "status", "foo", ("pods", "foo", "status")),
        ),
        (
            "GET",
            "/api/v1/watch/namespaces/other/pods",
            ("watch", "api", "", "v1", "other", "pods", "", "", ("pods",)),
        ),
        (
            "DELETE",
            "/apis/extensions/v1/namespaces/other/extensions",
            ("deletecollection", "apis", "extensions", "v1", "other", "extensions", "", "", ("extensions",)),
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods?fieldSelector=metadata.name%3Dfoo",
            ("list", "api", "", "v1", "other", "pods", "", "foo", ("pods",)),  # a list of one name
        ),
    ],
)
def test_request_info_is_built_from_the_decoded_path_and_the_parsed_query(
    method: str, target: str, expected: tuple[object, ...]
) -> None:
    info = built(method, target).info
    assert info is not None and info.is_resource_request
    got = (
        info.verb,
        info.api_prefix,
        info.api_group,
        info.api_version,
        info.namespace,
        info.resource,
        info.subresource,
        info.name,
        info.parts,
    )
    assert got == expected


def test_a_non_resource_path_has_the_lowercase_method_as_verb() -> None:
    ctx = built("HEAD", "/healthz/ping")
    assert ctx.info == RequestInfo(False, "/healthz/ping", "head")
    assert ctx.info_error == ""


def test_a_path_request_info_cannot_describe_is_kept_with_its_reason() -> None:
    # `/api/v1/watch` names no resource: upstream's NewRequestInfo fails and authorization says 500.
    ctx = built("GET", "/api/v1/watch?x=1")
    assert ctx.info is None
    assert ctx.info_error == "unable to determine kind and namespace from url, /api/v1/watch?x=1"
    assert ctx.long_running is False


# --- the long-running rule -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "long_running"),
    [
        # BasicLongRunningRequestCheck({"watch", "proxy"}, {"attach", "exec", "proxy", "log", "portforward"})
        ("GET", "/api/v1/pods?watch=true", True),
        ("GET", "/api/v1/pods?watch=false", False),
        ("GET", "/api/v1/watch/pods", True),
        ("GET", "/apis/wardle.example.com/v1alpha1/watch/namespaces/n/flunders/f", True),
        ("GET", "/api/v1/namespaces/n/pods/p/log", True),
        ("POST", "/api/v1/namespaces/n/pods/p/exec", True),
        ("POST", "/api/v1/namespaces/n/pods/p/attach", True),
        ("POST", "/api/v1/namespaces/n/pods/p/portforward", True),
        ("GET", "/api/v1/namespaces/n/services/s/proxy/x", True),
        ("GET", "/api/v1/proxy/namespaces/n/services/s", True),  # the proxy verb
        ("GET", "/debug/pprof/profile", True),
        ("GET", "/api/v1/namespaces/n/pods/p/status", False),
        ("GET", "/api/v1/namespaces/n/pods", False),
        ("PATCH", "/api/v1/namespaces/n/pods/p", False),
        (
            "GET",
            "/apis/wardle.example.com/v1alpha1/namespaces/n/flunders/log",
            False,
        ),  # a name, not a subresource
        ("GET", "/log", False),  # non-resource: only /debug/pprof/ is
        ("GET", "/healthz", False),
    ],
)
def test_long_running_is_kube_apiservers_check(method: str, target: str, long_running: bool) -> None:
    ctx = built(method, target)
    assert ctx.upgrade is False
    assert ctx.long_running is long_running
    assert is_long_running(ctx.info, upgrade=False) is long_running


@pytest.mark.parametrize(
    "connection",
    ["Upgrade", "upgrade", "keep-alive, Upgrade", "KEEP-ALIVE,UPGRADE"],
)
def test_every_upgrade_is_long_running_whatever_the_path(connection: str) -> None:
    # Upstream's check ignores upgrades; a gateway tunnels each one for as long as the client wants.
    ctx = built(
        "GET", "/apis/wardle.example.com/v1alpha1/namespaces/n/flunders/f/custom", Connection=connection
    )
    assert ctx.upgrade is True
    assert ctx.long_running is True


def test_an_upgrade_header_without_connection_upgrade_is_not_an_upgrade() -> None:
    # httpstream.IsUpgradeRequest reads only `Connection`.
    ctx = built("GET", "/api/v1/namespaces/n/pods/p", Upgrade="websocket", Connection="keep-alive")
    assert (ctx.upgrade, ctx.long_running) == (False, False)


def test_every_connection_header_counts_for_an_upgrade() -> None:
    several = CIMultiDictProxy(CIMultiDict([("Connection", "keep-alive"), ("Connection", "Upgrade")]))
    assert is_upgrade_request(several)
    assert not is_upgrade_request(headers())


def test_an_upgrade_whose_request_info_failed_is_still_long_running() -> None:
    assert is_long_running(None, upgrade=True)
    assert not is_long_running(None, upgrade=False)


# --- the connection ------------------------------------------------------------------------------


class _Transport(asyncio.BaseTransport):
    def __init__(self, extra: dict[str, object]) -> None:
        super().__init__()
        self._extra = extra

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._extra.get(name, default)


@pytest.mark.parametrize(
    ("peer", "remote"),
    [
        (("10.0.0.1", 5555), "10.0.0.1"),
        (("::1", 5555, 0, 0), "::1"),
        ("/run/sock", "/run/sock"),
        (None, None),
    ],
)
def test_a_connection_reads_its_peer_once(peer: object, remote: str | None) -> None:
    connection = Connection.of_transport(_Transport({"peername": peer}))
    assert connection.remote == remote
    assert connection.ssl_object is None
    assert connection.presented is None
