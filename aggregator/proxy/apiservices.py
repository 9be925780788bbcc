"""`/apis/<group>/<version>[/...]`, any method, to the registered APIService's backend.

Routes exist only for registered remote APIServices; local ones (no `spec.service`) and unknown
group-versions fall to the router's fallback (kube-apiserver in kube mode, a 404 in local mode).
Decision order is upstream's `proxyHandler.ServeHTTP` (handler_proxy.go): vanished or local -> fallback; not
Available -> 503 `service unavailable` (and availability is asked to re-check it, rate-limited, so a
backend that is back is noticed at the pace of its clients rather than the 30 s resync); TLS settings that cannot be built -> 500 with the reason;
no authenticated user -> 500 `missing user`; no address -> 503 `service unavailable` (the log line
names the hop); then forward. Discovery requests (`/apis/<g>/<v>` itself) are bounded to 5 s.

Impersonation is applied before this handler, as upstream does (`auth/impersonation.py`): the
user here is the impersonated one, and no `Impersonate-*` header reaches the backend (`headers.py`).
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from aggregator.backends.addresses import PendingLookup
from aggregator.backends.errors import BackendError
from aggregator.backends.hops import LOOP_STATUS, PROXY_LOOP
from aggregator.contracts import Availability, Recheck
from aggregator.model.apiservice import APIService
from aggregator.proxy.forward import Forwarder
from aggregator.proxy.handling import HandlingTable
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.web.context import context_of
from aggregator.web.routing import Handler, Route, RouteKind

# Group served by the gateway itself; an APIService for it never takes its paths (upstream's
# go-restful container wins over the proxy mux).
OWN_GROUP = "apiregistration.k8s.io"


class APIServiceProxy:
    """Serves the routes of remote APIServices (upstream's `proxyHandler`, one per group-version).

    Subscribe `on_store_event` to the store (the composition root does): it keeps the routing table
    and the handling table (`handling.py`) in step with the objects.
    """

    def __init__(
        self,
        store: Store,
        *,
        availability: Availability,
        handling: HandlingTable,
        forwarder: Forwarder,
        fallback: Handler,
        recheck: Recheck | None = None,
    ) -> None:
        self.store = store
        self.availability = availability
        self.recheck = recheck
        self.handling = handling
        self.forwarder = forwarder
        self.fallback = fallback
        self._routes: dict[tuple[str, str], tuple[str, Route, Route]] = {}
        for svc in store.apiservices():
            self._register(svc)

    # --- routing table -----------------------------------------------------------------------------

    def claim(self, path: str) -> Route | None:
        """Router resolver: claims `/apis/<g>/<v>` and below for registered remote APIServices."""
        if not path.startswith("/apis/"):
            return None
        parts = path.split("/", 4)
        if len(parts) < 4:
            return None
        entry = self._routes.get((parts[2], parts[3]))
        if entry is None:
            return None
        if len(parts) == 4 or not parts[4]:
            return entry[1]
        return entry[2]

    def _register(self, svc: APIService) -> None:
        key = (svc.group, svc.version)
        if svc.local or not svc.group or svc.group == OWN_GROUP:
            self._routes.pop(key, None)
            return
        if key in self._routes and self._routes[key][0] == svc.name:
            return
        name = svc.name
        # Upgrades are never tunnelled on the discovery path (k/k#72113, CVE-2018-1002105).
        self._routes[key] = (
            name,
            Route(partial(self.serve, name=name, discovery=True), RouteKind.BACKEND, name, upgradable=False),
            Route(partial(self.serve, name=name, discovery=False), RouteKind.BACKEND, name, upgradable=True),
        )

    def on_store_event(self, event: Event) -> None:
        self.handling.on_store_event(event)
        if event.kind is not Kind.APISERVICE or not isinstance(event.obj, APIService):
            return
        svc = event.obj
        if event.type == DELETED:
            entry = self._routes.get((svc.group, svc.version))
            if entry is not None and entry[0] == svc.name:
                del self._routes[(svc.group, svc.version)]
            return
        old = event.old
        if isinstance(old, APIService) and (old.group, old.version) != (svc.group, svc.version):
            self._routes.pop((old.group, old.version), None)
        self._register(svc)

    # --- serving -----------------------------------------------------------------------------------

    async def serve(self, request: web.Request, *, name: str, discovery: bool) -> web.StreamResponse:
        info = self.handling.get(name)
        if info is None:
            return await self.fallback(request)
        ctx = context_of(request)
        assert ctx is not None, "the pipeline builds every request's context"
        forwarder = self.forwarder
        if not self.availability.is_available(name):
            if self.recheck is not None:
                self.recheck.suspect(name)
            if self.availability.reason(name) == PROXY_LOOP:
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
        try:
            dest = info.pick(self.handling.backends.resolver.rng.randrange)
            if isinstance(dest, PendingLookup):
                target = await self.handling.backends.resolver.finish_lookup(dest)
                dest = info.looked_up_destination(target)
        except BackendError as err:
            return forwarder.unresolvable(ctx, name, err)
        deadline = info.discovery_timeout if discovery else None
        return await forwarder.send(ctx, dest, user, deadline_seconds=deadline)
