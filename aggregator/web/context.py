"""What the gateway knows about one request: each fact derived once, then read by every gate,
handler, metric and log line.

kube-apiserver carries these facts in the request's context (`request.WithRequestInfo`,
`request.WithUser`, the deadline of `WithRequestDeadline`): its filters and handlers read them and
none derives them again. `RequestContext` is that context, built once from the protocol's
`ServerRequest` (`serverrequest.py`) before any gate runs:

- the head: method, request target, path (as sent, and decoded as Go's `URL.Path`: the one
  decoding every route, rule and log line uses), query (as sent, and parsed by Go's
  `URL.Query()` rules on first use, once), headers;
- the connection it came on (`connection.Connection`): the peer's address and TLS session, where
  the caller's certificate comes from;
- the route that serves it (matched on the decoded path), RequestInfo (`requestinfo.py`), and the
  long-running verdict by one rule (`is_long_running`);
- what the core gates learn: the user (and, when impersonating, who asked), the deadline;
- how it ended: the first status line written.

Features keep their own per-request facts under keys they declare (`ContextKey`, as
k8s.io/apiserver's packages own their context keys): the audit its record, max-in-flight the
kind it counted, the proxy the endpoint that answered. `log_fields` collects what a feature wants
in the request's access-log line.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.model.userinfo import UserInfo
from aggregator.tracing.api import RequestSpan
from aggregator.web.connection import HTTP1, HTTP2, Connection
from aggregator.web.requestinfo import RequestInfo, RequestInfoError, decoded_path, new_request_info
from aggregator.web.requestlabels import clean_dry_run, watch_requested
from aggregator.web.serverrequest import Answer, ServerRequest
from aggregator.wire.gourl import parse_query

__all__ = [
    "HTTP1",
    "HTTP2",
    "Connection",
    "ContextKey",
    "Handler",
    "HeadListener",
    "RequestContext",
    "Route",
    "RouteKind",
]

# kube-apiserver's long-running check (pkg/controlplane/apiserver/config.go BuildGenericConfig:
# `BasicLongRunningRequestCheck({"watch", "proxy"}, {"attach", "exec", "proxy", "log", "portforward"})`).
LONG_RUNNING_VERBS = frozenset({"watch", "proxy"})
LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "proxy", "log", "portforward"})
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_PRETTY_AGENTS = ("curl", "Wget", "Mozilla/5.0")
_EMPTY_QUERY: dict[str, list[str]] = {}

T = TypeVar("T")


def is_upgrade_request(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> bool:
    """apimachinery's `httpstream.IsUpgradeRequest`: some `Connection` header mentions `upgrade`."""
    values = headers.getall("Connection", None)
    if values is None:
        return False
    return any("upgrade" in value.lower() for value in values)


def is_long_running(info: RequestInfo | None, upgrade: bool) -> bool:
    """The one long-running rule: kube-apiserver's `BasicLongRunningRequestCheck` (watches, proxy,
    the streaming subresources and the profiler), or a protocol upgrade.

    Long-running requests are exempt from max-in-flight and the request timeout, counted in
    `apiserver_longrunning_requests`, audited with a ResponseStarted stage, and ended (not
    drained) at shutdown. Upstream's check ignores upgrades, which only its handlers know how to
    serve; for a gateway every upgrade is a tunnel that lasts as long as the client wants, so an
    upgrade on a path the check calls short (a WebSocket to a custom subresource) is long-running
    too. A request whose RequestInfo cannot be built is not (authorization answers it with a 500).
    """
    if upgrade:
        return True
    if info is None:
        return False
    if info.verb in LONG_RUNNING_VERBS:
        return True
    if info.is_resource_request:
        return info.subresource in LONG_RUNNING_SUBRESOURCES
    return info.path.startswith("/debug/pprof/")


class ContextKey(Generic[T]):
    """A per-request value a feature owns (Go's unexported context key types): the feature
    declares the key, sets the value, and whoever needs it imports the key from that feature."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, ctx: RequestContext) -> T | None:
        value: T | None = ctx.values.get(self)
        return value

    def set(self, ctx: RequestContext, value: T) -> None:
        ctx.values[self] = value

    def __repr__(self) -> str:
        return f"ContextKey({self.name!r})"


class RouteKind(enum.Enum):
    OWN = "own"  # answered by the gateway itself
    BACKEND = "backend"  # proxied to an extension API server
    DELEGATE = "delegate"  # forwarded to kube-apiserver, which authorizes it itself


# Serves a request: reads its context, answers through `ctx.request`, returns what it answered.
Handler = Callable[["RequestContext"], Awaitable[Answer]]


@dataclass(frozen=True, slots=True)
class Route:
    """Which component serves a path (`routing.Router` matches it), and what the gates must know
    of it before the handler runs."""

    handler: Handler
    kind: RouteKind
    # For logs and metrics: "healthz", "discovery", "v1beta1.metrics.k8s.io", "delegate", ...
    name: str
    # Served to callers without credentials even when --anonymous-auth is off (health probes).
    public: bool = False
    # Whether a protocol upgrade (exec, attach, port-forward) may be tunnelled through this route.
    upgradable: bool = False
    # More long-running paths than kube-apiserver's rule knows (an APIService's annotation).
    long_running: Callable[[str], bool] | None = None


# Told of the head of the request's answer as it goes out: (request, status code, its headers).
HeadListener = Callable[["RequestContext", int, CIMultiDict[str]], None]


class RequestContext:
    """One request's facts (see the module docstring). Built by the pipeline, never copied."""

    __slots__ = (
        "_query",
        "connection",
        "deadline",
        "handled",
        "headers",
        "info",
        "info_error",
        "listeners",
        "log_fields",
        "long_running",
        "method",
        "path",
        "priority",
        "raw_path",
        "raw_query",
        "received",
        "request",
        "requester",
        "route",
        "span",
        "status",
        "target",
        "task",
        "timed_out",
        "upgrade",
        "user",
        "values",
        "watch_deadline",
    )

    def __init__(
        self,
        request: ServerRequest,
        route_of: Callable[[str], Route],
        received: float,
        listeners: Sequence[HeadListener] = (),
    ) -> None:
        self.request = request
        self.method = method = request.method
        self.target = target = request.target  # as sent (path and query; absolute form kept)
        self.raw_path = raw_path = request.raw_path
        self.raw_query = raw_query = request.raw_query
        self.headers = headers = request.headers
        self.connection = request.connection
        self.received = received  # time.monotonic() when the pipeline got the request
        self.listeners = listeners
        self._query: dict[str, list[str]] | None = None if raw_query else _EMPTY_QUERY
        self.path = path = decoded_path(raw_path)
        self.route = route = route_of(path)
        try:
            self.info: RequestInfo | None = new_request_info(method, path, self.query, request_uri=target)
            self.info_error = ""
        except RequestInfoError as err:
            self.info = None
            self.info_error = str(err)
        self.upgrade = is_upgrade_request(headers)
        self.long_running = is_long_running(self.info, self.upgrade) or (
            route.long_running is not None and route.long_running(path)
        )
        # What the core gates learn.
        self.user: UserInfo | None = None
        # Set only when the caller impersonates someone: `user` is then the impersonated user
        # (an audit event's `user` is the requester, its `impersonatedUser` the user).
        self.requester: UserInfo | None = None
        # The deadline (time.monotonic()), None without one; `watch_deadline`: a watch's clean end.
        self.deadline: float | None = None
        self.watch_deadline = False
        self.timed_out = False
        self.task: Any = None  # the handler's task, once a deadline applies
        self.handled = False  # every gate let it through: its handler runs
        # How it ended: the first status line written.
        self.status: int | None = None
        # What features keep (`ContextKey`), and add to the access-log line.
        self.values: dict[ContextKey[Any], Any] = {}
        self.log_fields: dict[str, str] | None = None
        # Tracing hook: the request's span when it is sampled (`tracing/`), else None. A slot, not
        # a `ContextKey`: every hook on the fast path reads it (`is None` when not sampled).
        self.span: RequestSpan | None = None
        # What API Priority and Fairness decided (its FlowSchema, level and seats: flowcontrol/filter.py).
        # A slot, not a `ContextKey`: its gate, finisher and head listener read it on every request.
        self.priority: Any = None
        request.on_head = self.head_going_out

    # --- facts derived on first use ---------------------------------------------------------------

    @property
    def query(self) -> dict[str, list[str]]:
        """The query as Go's `URL.Query()` parses it, parsed once."""
        query = self._query
        if query is None:
            query = self._query = parse_query(self.raw_query)
        return query

    def query_value(self, name: str) -> str:
        """The first value of a query parameter (Go's `Values.Get`), "" when absent."""
        if not self.raw_query:
            return ""
        values = self.query.get(name)
        return values[0] if values else ""

    @property
    def remote(self) -> str | None:
        return self.connection.remote

    @property
    def pretty(self) -> bool:
        """Upstream's rule: `?pretty=<ParseBool>` wins, else curl, Wget and browsers get indented JSON."""
        if self.raw_query:
            pretty = self.query.get("pretty")
            if pretty and pretty[0]:
                return pretty[0] in _TRUE
        return self.headers.get("User-Agent", "").startswith(_PRETTY_AGENTS)

    @property
    def watch(self) -> bool:
        """Whether metrics and the proxy count it as a watch (metrics.go `getVerbIfWatch`)."""
        return "watch" in self.raw_query and watch_requested(self.method, self.query)

    @property
    def dry_run(self) -> str:
        """The `dry_run` label (metrics.go `cleanDryRun`)."""
        return clean_dry_run(self.query) if "dryRun" in self.raw_query else ""

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    # --- the status line ----------------------------------------------------------------------------

    def head_going_out(self, status: int, headers: CIMultiDict[str]) -> None:
        """A status line is about to be written (`ServerRequest.on_head`): tell the listeners once."""
        if self.status is not None:
            return
        self.status = status
        for listener in self.listeners:
            listener(self, status, headers)

    def add_log_field(self, name: str, value: str) -> None:
        """A fact for this request's access-log line (the endpoint that answered, a retry)."""
        if self.log_fields is None:
            self.log_fields = {}
        self.log_fields[name] = value
