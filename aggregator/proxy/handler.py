"""`/apis/<group>/<version>[/...]`, any method, to the registered APIService's backend.

Decision order is upstream's `proxyHandler.ServeHTTP` (§4.3): a local (or vanished) APIService goes
to the fallback (kube-apiserver in kube mode, a 404 in local mode); not Available -> 503 `service
unavailable`; TLS settings that cannot be built -> 500 with the reason; no authenticated user ->
500 `missing user`; no address -> 503 `service unavailable` (the log line names the hop); then the
request is forwarded. The gateway's own answers are Kubernetes Status objects (upstream writes
the same codes and messages as text/plain).

Forwarding streams both ways and never parses a body: the request body is handed to the client
as it arrives, response chunks are written as they come (a watch event reaches the caller when
the backend sends it), `Content-Length` and `Content-Encoding` pass through untouched, path and
query reach the backend byte for byte. A client that goes away cancels the handler (the server
runs with `handler_cancellation=True`), which closes the backend connection. A 3xx with a
`Location` becomes a 502 (CVE-2022-3172); transport failures become 503 `error trying to reach
service: <cause>`.
"""

from __future__ import annotations

import logging
import ssl
import time
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from yarl import URL

from aggregator.context import get_user
from aggregator.logs import fields
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo
from aggregator.proxy.errors import BackendError, Hop, classify
from aggregator.proxy.headers import forwarded_uri, request_headers, response_headers
from aggregator.proxy.resolver import Target
from aggregator.proxy.transport import SESSION_TIMEOUT, Backend
from aggregator.proxy.upgrade import UpgradeTunnel, is_upgrade_request, upgrade_refusal
from aggregator.responses import status_response
from aggregator.routing import Route, RouteKind
from aggregator.sources.store import DELETED, Event, Kind

if TYPE_CHECKING:
    from aggregator.server import Gateway

log = logging.getLogger(__name__)

REDIRECT_MESSAGE = "the backend attempted to redirect this request, which is not permitted"
# Group served by the gateway itself; an APIService for it never takes its paths (upstream's
# go-restful container wins over the proxy mux).
OWN_GROUP = "apiregistration.k8s.io"
# Methods Go's transport retries once when a pooled connection turns out to be closed.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
_LOG_EVERY = 10.0
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def verb_of(request: web.Request) -> str:
    """The metrics verb: the HTTP method, or WATCH for `?watch=<true>` (Go's ParseBool spellings)."""
    method = request.method
    if (
        method == "GET"
        and "watch=" in request.query_string
        and any(v in _TRUE for v in request.query.getall("watch", ()))
    ):
        return "WATCH"
    return method


class _HeadersWithBody(web.StreamResponse):
    """Headers go out with the first body bytes (one TLS record for a small response).

    Used only when the backend sent a Content-Length, i.e. the body is already on its way; a
    streamed (chunked) response such as a watch sends its headers at once.
    """

    _send_headers_immediately = False


class ProxyHandler:
    """Serves the routes of remote APIServices; one per gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.backends = gateway.backends
        self.metrics = gateway.metrics
        self.tunnel = UpgradeTunnel(gateway.backends, gateway.metrics)
        self._routes: dict[tuple[str, str], tuple[str, Route, Route]] = {}
        self._counters: dict[tuple[str, str, int], object] = {}
        self._last_logged: dict[tuple[str, str], float] = {}
        gateway.store.add_listener(self._on_event)
        for svc in gateway.store.apiservices():
            self._register(svc)

    # --- routing table -----------------------------------------------------------------------------

    def resolve(self, path: str) -> Route | None:
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

        async def discovery(request: web.Request) -> web.StreamResponse:
            return await self.serve(request, name, discovery=True)

        async def resources(request: web.Request) -> web.StreamResponse:
            return await self.serve(request, name, discovery=False)

        # Upgrades are never tunnelled on the discovery path (k/k#72113, CVE-2018-1002105).
        self._routes[key] = (
            name,
            Route(discovery, RouteKind.BACKEND, name, upgradable=False),
            Route(resources, RouteKind.BACKEND, name, upgradable=True),
        )

    def _on_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE or not isinstance(event.obj, APIService):
            return
        svc = event.obj
        if event.type == DELETED:
            entry = self._routes.get((svc.group, svc.version))
            if entry is not None and entry[0] == svc.name:
                del self._routes[(svc.group, svc.version)]
            return
        if isinstance(event.old, APIService) and (event.old.group, event.old.version) != (
            svc.group,
            svc.version,
        ):
            self._routes.pop((event.old.group, event.old.version), None)
        self._register(svc)

    # --- serving -----------------------------------------------------------------------------------

    async def serve(self, request: web.Request, name: str, *, discovery: bool) -> web.StreamResponse:
        gateway = self.gateway
        svc = gateway.store.apiservice(name)
        if svc is None or svc.service is None:
            return await gateway.router.fallback.handler(request)
        if not gateway.availability.is_available(name):
            return self._answer(request, name, 503, "service unavailable")
        backend = self.backends.backend_for(svc)
        if backend.error is not None or backend.context is None:
            return self._answer(request, name, 500, backend.error or "no TLS context")
        user = get_user(request)
        if user is None:
            return self._answer(request, name, 500, "missing user")
        try:
            found = self.backends.resolver.resolve_now(svc)
            target = found if isinstance(found, Target) else await self.backends.resolver.finish_lookup(found)
        except BackendError as err:
            self._backend_error(name, err, request)
            return self._answer(request, name, 503, "service unavailable")
        if is_upgrade_request(request.headers):
            refusal = upgrade_refusal(request)
            if refusal is not None:
                self.metrics.upgrade_rejected.labels("protocol").inc()
                return self._answer(request, name, 400, refusal)
            response = await self.tunnel.serve(request, name, backend, target, user)
            self._count(name, "CONNECT", response.status)
            return response
        return await self._forward(request, name, backend, target, user, discovery)

    async def _forward(
        self,
        request: web.Request,
        name: str,
        backend: Backend,
        target: Target,
        user: UserInfo,
        discovery: bool,
    ) -> web.StreamResponse:
        raw_path = request.raw_path
        if not raw_path.startswith("/"):  # absolute-form request target
            raw_path = request.rel_url.raw_path_qs
        headers = request_headers(
            request.headers.items(),
            user,
            self.backends.policy,
            authority=target.authority,
            client_ip=request.remote,
            forwarded_uri=forwarded_uri(raw_path),
        )
        method = request.method
        verb = verb_of(request)
        url = URL(target.base_url + raw_path, encoded=True)
        has_body = request.body_exists
        started = time.monotonic()
        backend.acquire()
        try:
            attempt = 0
            while True:
                try:
                    resp = await backend.session.request(
                        method,
                        url,
                        headers=headers,
                        data=request.content if has_body else None,
                        ssl=backend.context or False,
                        server_hostname=target.server_name,
                        allow_redirects=False,
                        timeout=self.backends.discovery_timeout if discovery else SESSION_TIMEOUT,
                    )
                    break
                except aiohttp.ServerDisconnectedError as err:
                    # A pooled connection the backend had just closed: Go retries such requests once.
                    attempt += 1
                    if attempt > 1 or has_body or method not in _IDEMPOTENT:
                        return self._unreachable(request, name, Hop.CONNECT, "EOF", err)
                except aiohttp.ClientConnectorCertificateError as err:
                    return self._unreachable(
                        request, name, Hop.TLS, await backend.explain_tls(target, err), err
                    )
                except (TimeoutError, aiohttp.ClientError, OSError, ssl.SSLError) as err:
                    hop, cause = classify(err, target.authority)
                    return self._unreachable(request, name, hop, cause, err)
            self.metrics.proxy_duration.labels(name, verb).observe(time.monotonic() - started)
            try:
                return await self._relay(request, name, verb, resp)
            finally:
                resp.close()
        finally:
            backend.release()

    async def _relay(
        self, request: web.Request, name: str, verb: str, resp: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        status = resp.status
        if 300 <= status < 400 and resp.headers.get("Location"):
            self.metrics.backend_errors.labels(name, Hop.REDIRECT.value).inc()
            log.warning(
                "backend answered with a redirect; refused",
                extra=fields(apiservice=name, status=status, method=request.method, path=request.path),
            )
            return self._answer(request, name, 502, REDIRECT_MESSAGE, verb)
        headers = response_headers(resp.headers.items())
        cls = _HeadersWithBody if resp.content_length is not None else web.StreamResponse
        out = cls(status=status, reason=resp.reason, headers=headers)
        self._count(name, verb, status)
        await out.prepare(request)
        content = resp.content
        while True:
            try:
                chunk = await content.readany()
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                # Headers are gone already: end the connection so the client sees a truncated
                # answer instead of a complete-looking one.
                hop, cause = classify(err, "")
                self.metrics.backend_errors.labels(name, hop.value).inc()
                log.info(
                    "backend response ended early",
                    extra=fields(apiservice=name, method=request.method, path=request.path, reason=cause),
                )
                if request.transport is not None:
                    request.transport.close()
                return out
            if not chunk:
                break
            # A client that went away raises ConnectionResetError here; the pipeline lets it through.
            await out.write(chunk)
        await out.write_eof()
        return out

    # --- answers and bookkeeping -------------------------------------------------------------------

    def _answer(
        self, request: web.Request, name: str, code: int, message: str, verb: str | None = None
    ) -> web.Response:
        self._count(name, verb or verb_of(request), code)
        response = status_response(request, code, message)
        if is_upgrade_request(request.headers):
            # No tunnel was set up: whatever the client sends next must not be read as a request.
            response.force_close()
        return response

    def _unreachable(
        self, request: web.Request, name: str, hop: Hop, cause: str, err: BaseException
    ) -> web.Response:
        self.metrics.backend_errors.labels(name, hop.value).inc()
        self._log_limited(
            name,
            cause,
            "error trying to reach service",
            apiservice=name,
            hop=hop.value,
            method=request.method,
            path=request.path,
            reason=cause,
        )
        return self._answer(request, name, 503, f"error trying to reach service: {cause}")

    def _backend_error(self, name: str, err: BackendError, request: web.Request) -> None:
        self.metrics.backend_errors.labels(name, err.hop.value).inc()
        self._log_limited(
            name,
            err.cause,
            "service unavailable: cannot resolve the backend",
            apiservice=name,
            hop=err.hop.value,
            method=request.method,
            path=request.path,
            reason=err.cause,
        )

    def _log_limited(self, name: str, cause: str, message: str, **values: object) -> None:
        """One line per APIService and cause every 10 s: a broken backend must not flood the log."""
        now = time.monotonic()
        key = (name, cause)
        last = self._last_logged.get(key)
        if last is not None and now - last < _LOG_EVERY:
            return
        if len(self._last_logged) > 1024:
            self._last_logged.clear()
        self._last_logged[key] = now
        log.warning(message, extra=fields(**values))

    def _count(self, name: str, method: str, code: int) -> None:
        key = (name, method, code)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = self.metrics.proxy_requests.labels(name, method, str(code))
        child.inc()  # type: ignore[attr-defined]
