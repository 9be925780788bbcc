"""`/apis/<group>/<version>[/...]`, any method, to the registered APIService's backend.

Routes exist only for registered remote APIServices; local ones (no `spec.service`) and unknown
group-versions fall to the router's fallback (kube-apiserver in kube mode, a 404 in local mode).

Each remote APIService is one `ServedAPIService`, kube-aggregator's `proxyHandler` with its
`proxyHandlingInfo`: its two routes (the discovery path and everything below it), its handling
info (`handling.py`: backend, addresses, endpoints, bounds), its availability and its requests in
flight, kept together. It is rebuilt when an event arrives (the APIService, its Service or an
EndpointSlice of that Service changed; a new front-proxy client certificate) and told of every
availability flip, so a request reaches it through its route and reads it, nothing more.

Decision order is upstream's `proxyHandler.ServeHTTP` (handler_proxy.go): vanished or local ->
fallback; not Available -> 503 `service unavailable` (and availability is asked to re-check it,
rate-limited, so a backend that is back is noticed at the pace of its clients rather than the
30 s resync); TLS settings that cannot be built -> 500 with the reason; no authenticated user ->
500 `missing user`; no address -> 503 `service unavailable` (the log line names the hop); then
forward. Discovery requests (`/apis/<g>/<v>` itself) are bounded to 5 s.

Impersonation is applied before this handler, as upstream does (`auth/impersonation.py`): the
user here is the impersonated one, and no `Impersonate-*` header reaches the backend (`headers.py`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from aggregator.backends.addresses import PendingLookup
from aggregator.backends.bounds import read_bounds
from aggregator.backends.errors import BackendError
from aggregator.backends.hops import LOOP_STATUS, PROXY_LOOP
from aggregator.contracts import Availability, Recheck
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo
from aggregator.proxy.forward import Forwarder, verb_of
from aggregator.proxy.handling import HandlingInfo, HandlingTable
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.web.context import RequestContext
from aggregator.web.responses import status_response
from aggregator.web.routing import Handler, Route, RouteKind
from aggregator.web.serverrequest import Answer, Response
from aggregator.web.timeout import RequestTimeouts

# Group served by the gateway itself; an APIService for it never takes its paths (upstream's
# go-restful container wins over the proxy mux).
OWN_GROUP = "apiregistration.k8s.io"
# The Retry-After of a 429 at an APIService's max-concurrent-requests (kube-apiserver's max-in-flight's).
RETRY_AFTER_SECONDS = 1


class ServedAPIService:
    """One remote APIService as the proxy serves it (see the module docstring)."""

    __slots__ = (
        "active",
        "annotations",
        "available",
        "discovery_route",
        "info",
        "name",
        "proxy",
        "reason",
        "resource_route",
    )

    def __init__(self, proxy: APIServiceProxy, svc: APIService) -> None:
        self.proxy = proxy
        self.name = svc.name
        self.annotations = svc.annotations
        self.info: HandlingInfo | None = None
        self.available = False
        self.reason = ""
        # Requests in flight, counted when the APIService has a max-concurrent-requests bound.
        self.active = 0
        # Upgrades are never tunnelled on the discovery path (k/k#72113, CVE-2018-1002105); the
        # extra long-running paths of its annotation are the route's, so the context knows at once.
        self.discovery_route = Route(self.serve_discovery, RouteKind.BACKEND, self.name, upgradable=False)
        self.resource_route = Route(
            self.serve_resource,
            RouteKind.BACKEND,
            self.name,
            upgradable=True,
            long_running=read_bounds(svc.annotations).long_running,
        )

    # The routes' handlers: the proxy's coroutine itself, without one of their own around it.
    def serve_discovery(self, ctx: RequestContext) -> Coroutine[Any, Any, Answer]:
        return self.proxy.serve(self, ctx, discovery=True)

    def serve_resource(self, ctx: RequestContext) -> Coroutine[Any, Any, Answer]:
        return self.proxy.serve(self, ctx, discovery=False)


@dataclass(eq=False)
class APIServiceProxy:
    """Serves the routes of remote APIServices (upstream's `proxyHandler`, one per group-version).

    Subscribe `on_store_event` to the store, `availability_changed` to availability, and
    `client_certificate_changed` to the front-proxy client certificate (the composition root
    does): they keep every `ServedAPIService` current.
    """

    store: Store
    _: KW_ONLY
    availability: Availability
    handling: HandlingTable
    forwarder: Forwarder
    fallback: Handler
    recheck: Recheck | None = None
    timeouts: RequestTimeouts | None = None
    # The routing table: (group, version) -> the APIService serving it.
    _routes: dict[tuple[str, str], ServedAPIService] = field(default_factory=dict, init=False)
    _served: dict[str, ServedAPIService] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for svc in self.store.apiservices():
            self._register(svc)

    # --- keeping each APIService current -------------------------------------------------------------

    def served(self, name: str) -> ServedAPIService | None:
        return self._served.get(name)

    def claim(self, path: str) -> Route | None:
        """Router resolver: claims `/apis/<g>/<v>` and below for registered remote APIServices."""
        if not path.startswith("/apis/"):
            return None
        parts = path.split("/", 4)
        if len(parts) < 4:
            return None
        served = self._routes.get((parts[2], parts[3]))
        if served is None:
            return None
        if len(parts) == 4 or not parts[4]:
            return served.discovery_route
        return served.resource_route

    def _register(self, svc: APIService) -> None:
        key = (svc.group, svc.version)
        name = svc.name
        if svc.local or not svc.group or svc.group == OWN_GROUP:
            self._forget(name)
            return
        served = self._served.get(name)
        if served is None or served.annotations != svc.annotations:
            if served is not None:
                self._unroute(served)
            served = ServedAPIService(self, svc)
            self._served[name] = served
        self._routes[key] = served
        served.info = self.handling.build(svc)
        self._refresh_availability(served)

    def _unroute(self, served: ServedAPIService) -> None:
        for key, routed in list(self._routes.items()):
            if routed is served:
                del self._routes[key]

    def _forget(self, name: str) -> None:
        served = self._served.pop(name, None)
        if served is not None:
            served.info = None
            self._unroute(served)
        self.handling.forget(name)

    def _refresh_availability(self, served: ServedAPIService) -> None:
        served.available = self.availability.is_available(served.name)
        served.reason = "" if served.available else self.availability.reason(served.name)

    def on_store_event(self, event: Event) -> None:
        if event.kind is Kind.APISERVICE:
            svc = event.obj
            if not isinstance(svc, APIService):
                return
            if event.type == DELETED:
                self._forget(svc.name)
                return
            old = event.old
            if isinstance(old, APIService) and (old.group, old.version) != (svc.group, svc.version):
                served = self._served.get(svc.name)
                if served is not None:
                    self._unroute(served)
            self._register(svc)
            return
        for svc in self.handling.affected(event):
            served = self._served.get(svc.name)
            if served is not None:
                served.info = self.handling.build(svc)

    def availability_changed(self, name: str) -> None:
        served = self._served.get(name)
        if served is not None:
            self._refresh_availability(served)

    def client_certificate_changed(self) -> None:
        """Every backend was retired with the old certificate: rebuild what each APIService uses."""
        for name, served in self._served.items():
            svc = self.store.apiservice(name)
            if svc is not None:
                served.info = self.handling.build(svc)

    # --- serving -----------------------------------------------------------------------------------

    async def serve(self, served: ServedAPIService, ctx: RequestContext, *, discovery: bool) -> Answer:
        info = served.info
        if info is None:
            return await self.fallback(ctx)  # gone (or turned local) while the request was authorized
        name = served.name
        forwarder = self.forwarder
        if not served.available:
            if self.recheck is not None:
                self.recheck.suspect(name)
            if served.reason == PROXY_LOOP:
                # Named, not upstream's bare 503: nothing the backend does will ever fix it.
                message = f"proxy loop detected: the backend of APIService {name} is an aggregator gateway"
                return forwarder.answer(ctx, name, LOOP_STATUS, message)
            return forwarder.answer(ctx, name, 503, "service unavailable")
        transport_error = info.transport_error
        if transport_error is not None:
            return forwarder.answer(ctx, name, 500, transport_error)
        user = ctx.user
        if user is None:
            return forwarder.answer(ctx, name, 500, "missing user")
        bounds = info.bounds
        if bounds.request_timeout is not None and self.timeouts is not None and not ctx.long_running:
            self.timeouts.rearm(ctx, bounds.request_timeout)
        limit = bounds.max_concurrent_requests
        if not limit:
            return await self._forward(ctx, info, user, discovery)
        if served.active >= limit:
            return self._too_many(ctx, name, limit)
        served.active += 1
        try:
            return await self._forward(ctx, info, user, discovery)
        finally:
            served.active -= 1

    async def _forward(self, ctx: RequestContext, info: HandlingInfo, user: UserInfo, discovery: bool) -> Answer:
        forwarder = self.forwarder
        try:
            endpoint = info.pick()
            if isinstance(endpoint, PendingLookup):
                target = await self.handling.backends.resolver.finish_lookup(endpoint)
                endpoint = info.looked_up_endpoint(target)
        except BackendError as err:
            return forwarder.unresolvable(ctx, info.name, err)
        deadline = info.discovery_timeout if discovery else None
        return await forwarder.send(
            ctx,
            endpoint.destination,
            user,
            deadline_seconds=deadline,
            endpoint=endpoint,
            endpoints=info.endpoints,
            bounds=info.bounds,
        )

    def _too_many(self, ctx: RequestContext, name: str, limit: int) -> Response:
        """At the APIService's max-concurrent-requests: a 429 at once, as kube-apiserver's
        max-in-flight answers, but as a Status naming the APIService (apierrors.NewTooManyRequests)."""
        self.forwarder.metrics.apiservice_rejected.labels(name).inc()
        self.forwarder.count(name, verb_of(ctx), 429)
        message = (
            f"Too many requests: APIService {name} already has {limit} requests in flight "
            "(its aggregator.dev/max-concurrent-requests), please try again later."
        )
        return status_response(
            ctx,
            429,
            message,
            details={"retryAfterSeconds": RETRY_AFTER_SECONDS},
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
