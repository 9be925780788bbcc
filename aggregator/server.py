"""Builds and runs one gateway: the `Gateway` object owns the store, caches, sessions and tasks.

Every request goes through one pipeline: match a route, authenticate, authorize, serve, log. The
stages that later components add (authentication, authorization, the proxy) plug into the
`Gateway` rather than into module-level state, so tests can run several gateways side by side.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from aiohttp import web

from aggregator import __version__
from aggregator.auth.authn import Authenticator
from aggregator.auth.setup import install_authentication, install_authorization
from aggregator.availability import install_availability
from aggregator.config import ConfigError, Options, tls_policy
from aggregator.discovery.component import install_discovery
from aggregator.kube.client import KubeClient, client_for_options
from aggregator.openapi.component import install_openapi
from aggregator.proxy.setup import install_proxy
from aggregator.proxy.transport import Backends
from aggregator.sources.files import FolderSource
from aggregator.sources.kube import KubeSource
from aggregator.sources.store import Store
from aggregator.tls.pem import PEMError
from aggregator.tls.serving import ServingCertificate, resolve_serving_files
from aggregator.util.logs import ACCESS_LOGGER, fields
from aggregator.util.runtime import new_event_loop, wait_for_termination
from aggregator.web.context import get_user, set_route
from aggregator.web.health import ENDPOINTS, HealthChecks
from aggregator.web.metrics import Metrics
from aggregator.web.responses import json_response, not_found, status_response
from aggregator.web.routing import Route, RouteKind, Router

log = logging.getLogger(__name__)
access_log = logging.getLogger(ACCESS_LOGGER)

# A pipeline stage before the handler: returns a response to stop the request, or None to go on.
Gate = Callable[[web.Request, Route], Awaitable[web.StreamResponse | None]]


class Component(Protocol):
    """Something with a lifetime: started after the store's sources, stopped in reverse order."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Availability(Protocol):
    """Whether requests for an APIService may be proxied (upstream: its Available condition)."""

    def is_available(self, name: str) -> bool: ...


class ConditionAvailability:
    """The APIService object's own `Available` condition, as upstream's proxy reads it.

    The availability checker replaces this with its own, hop-by-hop view.
    """

    def __init__(self, store: Store) -> None:
        self._store = store

    def is_available(self, name: str) -> bool:
        svc = self._store.apiservice(name)
        return svc is not None and svc.available


class Gateway:
    """Everything one running gateway owns. Handlers get what they need from here."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.health = HealthChecks()
        self.metrics = Metrics()
        self.store = Store()
        self.router = Router(Route(self._not_found, RouteKind.OWN, "not-found"))
        self.gates: list[Gate] = []
        self.components: list[Component] = []
        self.shutting_down = False
        self.started = False
        # Human-readable start-up facts components add to ("client certificates (client CA)", ...).
        self.auth_summary: list[str] = []
        self.authenticator: Authenticator | None = None
        # kube-apiserver client: kube mode, or local mode with --kubeconfig (reviews only).
        self.kube: KubeClient | None = None
        self.availability: Availability = ConditionAvailability(self.store)
        # Backend transports (TLS contexts, pools, resolution) and `fetch`, for the proxy and for
        # the gateway's own backend calls (discovery, availability).
        self.backends = Backends(options, self.store, self.metrics)

        self.health.add("ping", lambda: None)
        self.health.add("shutdown", self._shutdown_check, livez=False)
        self.health.add("apiservice-registry-synced", self.store.synced_check, livez=False)
        for endpoint in ENDPOINTS:
            route = Route(self.health.handler(endpoint), RouteKind.OWN, endpoint, public=True)
            self.router.add_exact(f"/{endpoint}", route)
            self.router.add_prefix(f"/{endpoint}/", route)
        self.router.add_exact("/metrics", Route(self.metrics.handle, RouteKind.OWN, "metrics"))
        if options.local_mode:
            self.router.add_exact("/version", Route(self._version, RouteKind.OWN, "version"))

    # --- lifecycle ---------------------------------------------------------------------------------

    def add_component(self, component: Component) -> None:
        self.components.append(component)

    async def start(self) -> None:
        for component in self.components:
            await component.start()
        self.started = True

    async def stop(self) -> None:
        for component in reversed(self.components):
            try:
                await component.stop()
            except Exception:
                log.exception("stopping %s failed", type(component).__name__)

    def _shutdown_check(self) -> str | None:
        return "the gateway is shutting down" if self.shutting_down else None

    # --- request pipeline --------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)

        async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
            await self.start()
            yield
            await self.stop()

        app.cleanup_ctx.append(lifecycle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        route = self.router.match(request.path)
        set_route(request, route)
        response: web.StreamResponse | None = None
        try:
            for gate in self.gates:
                response = await gate(request, route)
                if response is not None:
                    return response
            response = await route.handler(request)
            return response
        except web.HTTPException as exc:
            response = exc
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("request failed", extra=fields(method=request.method, path=request.path))
            response = status_response(
                request, 500, "Internal error occurred: the gateway failed to serve this request"
            )
            return response
        finally:
            self._log_access(request, route, response, started)

    def _log_access(
        self, request: web.Request, route: Route, response: web.StreamResponse | None, started: float
    ) -> None:
        code = response.status if response is not None else 499
        self.metrics.requests.labels(route.kind.value, str(code)).inc()
        if not access_log.isEnabledFor(logging.INFO):
            return
        user = get_user(request)
        access_log.info(
            "request",
            extra=fields(
                method=request.method,
                path=request.path,
                status=code,
                duration_ms=round((time.monotonic() - started) * 1000, 2),
                user=user.name if user is not None else "",
                route=route.name,
                remote=request.remote or "",
            ),
        )

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        return not_found(request)

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return json_response(request, version_info())


def version_info() -> dict[str, str]:
    """`/version` in kube-apiserver's shape, describing the gateway itself."""
    major, minor, *_ = [*__version__.split("."), "0", "0"]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{__version__}",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}/{platform.machine()}",
    }


def build_gateway(options: Options) -> Gateway:
    """Wire every component the options ask for into one Gateway.

    Order matters: the kube client is added first so it stops last; gates run in the order they
    are installed (authentication, then authorization); availability replaces the proxy's view of
    which APIServices may be served and wakes discovery when a verdict flips.
    """
    gateway = Gateway(options)
    gateway.kube = client_for_options(options)
    if gateway.kube is not None:
        gateway.add_component(gateway.kube)
    if options.kube_mode and gateway.kube is not None:
        gateway.add_component(KubeSource(gateway.kube, gateway.store, gateway.metrics))
    if options.apiservices_dir is not None:
        gateway.add_component(FolderSource(options.apiservices_dir, gateway.store))
    install_authentication(gateway)
    install_authorization(gateway)
    install_proxy(gateway)
    discovery = install_discovery(gateway)
    install_openapi(gateway)
    availability = install_availability(gateway)
    # A verdict flip sends discovery back to the backend at once: an APIService found down goes
    # Stale now, not at the next refresh, and Current again as soon as it is back.
    availability.add_listener(discovery.fetcher.poke)
    return gateway


def _serving_hosts(options: Options) -> list[str]:
    hosts = [socket.gethostname()]
    if options.bind_address not in ("0.0.0.0", "::"):
        hosts.append(options.bind_address)
    return hosts


class GatewayServer:
    """A gateway listening on its TLS port: what `serve` runs, and what tests start in-process."""

    def __init__(self, options: Options, gateway: Gateway | None = None) -> None:
        self.options = options
        cert_file, key_file, generated = resolve_serving_files(
            options.tls_cert_file, options.tls_private_key_file, options.cert_dir, _serving_hosts(options)
        )
        if generated:
            log.info("generated a self-signed serving certificate", extra=fields(cert_file=cert_file))
        client_cas = [f for f in (options.client_ca_file, options.requestheader_client_ca_file) if f]
        try:
            self.serving = ServingCertificate(
                cert_file, key_file, client_ca_files=client_cas, policy=tls_policy(options)
            )
        except PEMError as err:
            flag = "--tls-cert-file" if options.tls_cert_file else "--cert-dir"
            raise ConfigError(flag, str(err)) from err
        self.gateway = gateway or build_gateway(options)
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = self.options.bind_address
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"https://{host}:{self.port}"

    async def start(self) -> int:
        self._runner = web.AppRunner(
            self.gateway.build_app(),
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=75,
            max_line_size=65536,
            max_field_size=65536,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.options.bind_address,
            self.options.secure_port,
            ssl_context=self.serving.context,
            backlog=1024,
        )
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            address = f"{self.options.bind_address}:{self.options.secure_port}"
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise ConfigError("--secure-port", f"cannot listen on {address}: {reason}") from err
        self.serving.start()
        self.port = _bound_port(site) or self.options.secure_port
        log.info(
            "serving",
            extra=fields(
                mode="local" if self.options.local_mode else "kube",
                address=f"https://{self.options.bind_address}:{self.port}",
                objects=self.options.apiservices_dir or self.options.kubeconfig or "in-cluster",
                auth=", ".join(self.gateway.auth_summary) or "none configured",
                version=__version__,
            ),
        )
        return self.port

    async def stop(self) -> None:
        self.gateway.shutting_down = True
        await self.serving.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve(options: Options) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    server = GatewayServer(options)
    await server.start()
    await wait_for_termination()
    log.info("shutting down")
    server.gateway.shutting_down = True
    if options.shutdown_delay_duration > 0:
        await asyncio.sleep(options.shutdown_delay_duration)
    await server.stop()
    return 0


def _bound_port(site: web.TCPSite) -> int | None:
    server = site._server  # aiohttp exposes no public accessor for the bound socket
    sockets = getattr(server, "sockets", None) or []
    for sock in sockets:
        return int(sock.getsockname()[1])
    return None


def run(options: Options) -> int:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(serve(options))
