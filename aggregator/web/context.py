"""What the gateway knows about one request: each fact derived once, then read by every gate,
metric and log line.

kube-apiserver carries these facts in the request's context (`request.WithRequestInfo`,
`request.WithUser`, `audit.WithAuditContext`, the deadline of `WithRequestDeadline`): its filters
and handlers read them and none derives them again. `RequestContext` is that context. It is built
once, when the request's head has been parsed and its route matched, before any gate runs:

- the head: method, request target, path (as sent, and decoded as Go's `URL.Path`), query (as
  sent, and parsed by Go's `URL.Query()` rules on first use), headers;
- the connection it came on (`Connection`): the peer's address and TLS session, where the
  caller's certificate comes from;
- RequestInfo (`requestinfo.py`), and the long-running verdict by one rule (`is_long_running`);
- what the gates learn: the user (and, when impersonating, who asked), the authorization
  decision, the audit ID and record, the deadline;
- how it ended: the first status line written and the response it belongs to.

It is protocol-neutral: all of the above is plain data, so an HTTP/2 stream builds one as an
HTTP/1.1 request does (`RequestContext.__init__` takes the head, not aiohttp's request);
`request` is the protocol's own request object, used only by the handlers that stream an answer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDictProxy

from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo, RequestInfoError, decoded_path, new_request_info
from aggregator.web.requestlabels import clean_dry_run, watch_requested
from aggregator.web.routing import Route
from aggregator.wire.gourl import parse_query

# kube-apiserver's long-running check (pkg/controlplane/apiserver/config.go BuildGenericConfig:
# `BasicLongRunningRequestCheck({"watch", "proxy"}, {"attach", "exec", "proxy", "log", "portforward"})`).
LONG_RUNNING_VERBS = frozenset({"watch", "proxy"})
LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "proxy", "log", "portforward"})
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_PRETTY_AGENTS = ("curl", "Wget", "Mozilla/5.0")
_EMPTY_QUERY: dict[str, list[str]] = {}
# A connection's protocol, as Go's `Request.Proto` names it.
HTTP1 = "HTTP/1.1"
HTTP2 = "HTTP/2.0"


def is_upgrade_request(headers: CIMultiDictProxy[str]) -> bool:
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


class BodyTap(Protocol):
    """Sees every chunk of a body as it passes (the audit's bounded copy)."""

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...


class AuditTrail(Protocol):
    """What the request path asks of the request's audit record (`audit/filter.py`)."""

    def request_capture(self) -> BodyTap | None: ...

    def response_capture(self, content_type: str, content_encoding: str) -> BodyTap | None: ...


class Connection:
    """One client connection: the peer's address, its TLS session and the protocol it speaks
    (HTTP/1.1, or HTTP/2 when ALPN chose `h2`), read once.

    `presented` is authentication's memo of what the peer's certificate chain said
    (`auth/authn.py`), kept for as long as the connection lives: every stream of an HTTP/2
    connection is the same caller.
    """

    __slots__ = ("presented", "protocol", "remote", "ssl_object")

    def __init__(self, remote: str | None, ssl_object: ssl.SSLObject | None, protocol: str = HTTP1) -> None:
        self.remote = remote
        self.ssl_object = ssl_object
        self.protocol = protocol
        self.presented: Any = None

    @classmethod
    def of_transport(cls, transport: asyncio.BaseTransport, protocol: str = HTTP1) -> Connection:
        """A new client connection (what the server records once per connection)."""
        peer = transport.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple | list) and peer else (str(peer) if peer else None)
        return cls(remote, transport.get_extra_info("ssl_object"), protocol)

    @classmethod
    def of_request(cls, request: web.BaseRequest) -> Connection:
        """The connection an HTTP/1.1 request came on (the server's protocol keeps one per
        connection, `util._aiohttp.TimedRequestHandler`; a test's request gets a fresh one)."""
        known = getattr(request.protocol, "gateway_connection", None)
        if isinstance(known, Connection):
            return known
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        return cls(request.remote, ssl_object)


# (request, status code, the response whose head goes out; None for a head written raw, a 101)
HeadListener = Callable[["RequestContext", int, "web.StreamResponse | None"], None]


class RequestContext:
    """One request's facts (see the module docstring). Built by the pipeline, never copied."""

    __slots__ = (
        "_query",
        "audit",
        "audit_id",
        "authorization",
        "connection",
        "deadline",
        "endpoint",
        "handled",
        "headers",
        "inflight_kind",
        "info",
        "info_error",
        "instrumented_as",
        "listeners",
        "long_running",
        "method",
        "path",
        "priority",
        "raw_path",
        "raw_query",
        "received",
        "request",
        "requester",
        "response",
        "retried",
        "route",
        "status",
        "target",
        "task",
        "timed_out",
        "tracked",
        "upgrade",
        "user",
        "watch_deadline",
    )

    def __init__(
        self,
        *,
        method: str,
        target: str,
        raw_path: str,
        raw_query: str,
        headers: CIMultiDictProxy[str],
        connection: Connection,
        route: Route,
        received: float,
        request: web.Request,
        listeners: Sequence[HeadListener] = (),
    ) -> None:
        self.method = method
        self.target = target  # the request target as sent (path and query; absolute form kept)
        self.raw_path = raw_path
        self.raw_query = raw_query
        self.headers = headers
        self.connection = connection
        self.route = route
        self.received = received  # time.monotonic() when the pipeline got the request
        self.request = request
        self.listeners = listeners
        self._query: dict[str, list[str]] | None = None if raw_query else _EMPTY_QUERY
        self.path = decoded_path(raw_path)
        try:
            self.info: RequestInfo | None = new_request_info(
                method, self.path, self.query, request_uri=target
            )
            self.info_error = ""
        except RequestInfoError as err:
            self.info = None
            self.info_error = str(err)
        self.upgrade = is_upgrade_request(headers)
        self.long_running = is_long_running(self.info, self.upgrade) or (
            route.long_running is not None and route.long_running(self.path)
        )
        # What the gates learn.
        self.user: UserInfo | None = None
        # Set only when the caller impersonates someone: `user` is then the impersonated user
        # (an audit event's `user` is the requester, its `impersonatedUser` the user).
        self.requester: UserInfo | None = None
        # The authorization decision and its reason (the audit's `authorization.k8s.io/*`).
        self.authorization: tuple[bool, str] | None = None
        self.audit_id: str | None = None
        self.audit: AuditTrail | None = None
        # The deadline (time.monotonic()), None without one; `watch_deadline`: a watch's clean end.
        self.deadline: float | None = None
        self.watch_deadline = False
        self.timed_out = False
        self.task: Any = None  # the handler's task, once a deadline applies
        self.tracked = False  # counted by the shutdown tracker (`longrunning.InFlight`)
        # The request kind max-in-flight counted it under, to give its place back at the end.
        self.inflight_kind: str | None = None
        # What API Priority and Fairness decided (its FlowSchema, level and seats: flowcontrol/filter.py).
        self.priority: Any = None
        # How it ended.
        self.status: int | None = None  # the first status line written
        self.response: web.StreamResponse | None = None  # the response whose head went out
        self.handled = False  # every gate let it through: its handler runs
        # A proxied request: the endpoint that answered (`ip:port`), and what made it retry, if it did.
        self.endpoint: str | None = None
        self.retried: str | None = None
        # Set by a handler upstream wraps in `metrics.InstrumentHandlerFunc` with fixed labels
        # (aggregated discovery, OpenAPI v3): the (subresource, component) it is counted under.
        self.instrumented_as: tuple[str, str] | None = None

    @classmethod
    def of_request(
        cls, request: web.Request, route: Route, received: float, listeners: Sequence[HeadListener] = ()
    ) -> RequestContext:
        """The context of an HTTP/1.1 request (aiohttp's parsed head)."""
        target = request.raw_path
        url = request.rel_url
        return cls(
            method=request.method,
            target=target,
            raw_path=url.raw_path,
            raw_query=url.raw_query_string,
            headers=request.headers,
            connection=Connection.of_request(request),
            route=route,
            received=received,
            request=request,
            listeners=listeners,
        )

    # --- facts derived on first use ---------------------------------------------------------------

    @property
    def query(self) -> dict[str, list[str]]:
        """The query as Go's `URL.Query()` parses it, parsed once."""
        query = self._query
        if query is None:
            query = self._query = parse_query(self.raw_query)
        return query

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

    def head_going_out(self, status: int, response: web.StreamResponse | None) -> None:
        """A status line is written (a response's head, or a raw `101`): tell the listeners once."""
        if self.status is not None:
            return
        self.status = status
        self.response = response
        for listener in self.listeners:
            listener(self, status, response)

    def instrument_as(self, subresource: str, component: str) -> None:
        """Count this request in `apiserver_request_total` as upstream's fixed-label handler wrapper
        does (`InstrumentHandlerFunc("GET", "", "", "", subresource, "", component)`)."""
        self.instrumented_as = (subresource, component)


def context_of(request: web.BaseRequest) -> RequestContext | None:
    """The context the pipeline attached to `request` (None for a request it never saw)."""
    ctx = getattr(request, "gateway_context", None)
    return ctx if isinstance(ctx, RequestContext) else None


def instrument_as(request: web.BaseRequest, subresource: str, component: str) -> None:
    """`RequestContext.instrument_as` for a handler that has the protocol's request object."""
    ctx = context_of(request)
    if ctx is not None:
        ctx.instrument_as(subresource, component)


def user_of(request: web.BaseRequest) -> UserInfo | None:
    """The user the gates settled on, for a handler that has the protocol's request object."""
    ctx = context_of(request)
    return ctx.user if ctx is not None else None
