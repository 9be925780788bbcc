"""The composition root: every component of one gateway, built with what it needs, in order.

This is the only module that imports every feature, and the one place to read to see how the
gateway fits together (as kube-aggregator's `NewWithDelegate`). Each component receives its
dependencies as constructor arguments, by the narrow interfaces in `contracts.py` where a feature
needs another; nothing reaches into a shared container, and nothing is swapped after it was built.

Order:
 1. observability and state: metrics, health checks, the object store;
 2. kube-apiserver: the client (kube mode, or local mode with --kubeconfig for reviews) and the
    object source (the kube watch, or the folder);
 3. authentication, then authorization (the pipeline's first gates);
 4. the backends: address resolution, the front-proxy client certificate, one TLS context and
    pool per TLS setting;
 5. availability, before anything that asks whether an APIService may be served;
 6. the fallback for unserved paths (kube-apiserver in kube mode, a 404 in local mode), then the
    APIService proxy, discovery, OpenAPI, and local mode's apiregistration.k8s.io;
 7. the router, the pipeline's gates, the health checks, and the start order.

Components start in the order listed in `Gateway.components` and stop in reverse: the kube
client first and last, the sources before anything that waits for the store to sync.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aggregator.apiregistration.api import APIRegistration
from aggregator.audit.factory import build_auditor
from aggregator.audit.filter import AuditLog, RequestAuditing
from aggregator.audit.recorder import AUDIT_ID, Auditor
from aggregator.auth.authconfigmap import CHECK_NAME as CLUSTER_AUTH_CHECK
from aggregator.auth.authconfigmap import AuthConfigMap
from aggregator.auth.authn import Authenticator, limit_unauthenticated_http2
from aggregator.auth.authz import Authorizer
from aggregator.auth.build import build_authentication, build_authorization
from aggregator.auth.impersonation import Impersonator
from aggregator.auth.options import RequestHeaderOptions
from aggregator.auth.rbacfolder import RBACFolder
from aggregator.auth.rbacobjects import is_rbac
from aggregator.auth.selfreviews import SelfReviews
from aggregator.availability.checker import FIRST_ROUND_CHECK, AvailabilityChecker
from aggregator.availability.ejections import EjectionBook
from aggregator.availability.probe import DiscoveryProbe
from aggregator.availability.quarantine import DiscoveryQuarantine
from aggregator.availability.status import (
    ALWAYS_LEADS,
    KubeStatusWriter,
    Leadership,
    MemoryStatus,
    StatusSink,
    StoreStatus,
)
from aggregator.backends.addresses import AddressResolver
from aggregator.backends.client_cert import ProxyClientCertificate
from aggregator.backends.frontproxy import MissingClientCertificateWarning
from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.backends.hops import new_instance
from aggregator.backends.metrics import BackendMetrics
from aggregator.backends.options import BackendConfig
from aggregator.backends.registry import BackendRegistry
from aggregator.config import Config
from aggregator.contracts import Availability, Component, EjectionReport, Recheck
from aggregator.discovery.component import KUBE_DISCOVERY_CHECK, Discovery
from aggregator.discovery.legacy import LegacyDiscovery
from aggregator.discovery.routes import AggregatedEndpoint, DiscoveryRoutes
from aggregator.flowcontrol.manifests import is_flowcontrol
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.flowcontrol.options import FlowControlConfig
from aggregator.flowcontrol.runtime import FlowControl
from aggregator.flowcontrol.sources import CHECK_NAME as FLOWCONTROL_CHECK
from aggregator.flowcontrol.sources import ConfigSource, FolderConfig, HeldConfig, KubeConfig, StaticConfig
from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.kube.client import KubeClient
from aggregator.leaderelection import CHECK_NAME as LEADER_CHECK
from aggregator.leaderelection import LeaderElector, elector_for
from aggregator.openapi.component import OpenAPIAggregation
from aggregator.openapi.readiness import CHECK_NAME as KUBE_OPENAPI_CHECK
from aggregator.openapi.routes import OpenAPIRoutes, PublishedOpenAPI
from aggregator.proxy.apiservices import APIServiceProxy
from aggregator.proxy.delegate import FRONT_PROXY, Delegate
from aggregator.proxy.forward import Forwarder
from aggregator.proxy.handling import HandlingTable
from aggregator.proxy.loops import loop_gate
from aggregator.proxy.metrics import ProxyMetrics
from aggregator.proxy.upgrade import UpgradeTunnel, upgrade_gate
from aggregator.sources.files import FolderSource
from aggregator.sources.kube import KubeSource
from aggregator.sources.options import SourceConfig
from aggregator.sources.problems import ManifestReport, merged_problems
from aggregator.sources.reflector import WatchMetrics
from aggregator.sources.store import Store
from aggregator.tls.verify import CAPool
from aggregator.tracing.api import RequestTracer
from aggregator.tracing.gates import AUTHENTICATION, AUTHORIZATION, PRIORITY_AND_FAIRNESS, traced_gate
from aggregator.tracing.options import tracer_for
from aggregator.web.accesslog import AccessLog, AccessLogPolicy
from aggregator.web.certexpiry import (
    AUTHENTICATION_CONFIGMAP,
    CLIENT_CA,
    PROXY_CLIENT,
    REQUESTHEADER_CLIENT_CA,
    CertificateExpiry,
    CertificateSource,
)
from aggregator.web.health import ENDPOINTS, HealthChecks
from aggregator.web.inflight import MaxInFlight
from aggregator.web.instrumentation import RequestInstrumentation
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Increments
from aggregator.web.options import RequestLimits
from aggregator.web.paths import refuse_confusing_paths
from aggregator.web.pipeline import Finisher, Gate, Pipeline
from aggregator.web.requestmetrics import RequestMetrics
from aggregator.web.responses import serve_not_found
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.timeout import RequestTimeouts
from aggregator.web.version import serve_version
from aggregator.workers.replica import CHANNEL_CHECK as CONTROL_CHECK
from aggregator.workers.replica import Replica

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Control:
    """What a gateway derives from the objects it watches: the object source, availability, the
    discovery and OpenAPI documents, the quarantine and leader election. Built in a single process
    and in the control process of `--workers N`; a worker follows the control's copies through its
    `Replica` instead."""

    kube_source: KubeSource | None
    folder: FolderSource | None
    availability: AvailabilityChecker
    ejections: EjectionBook
    quarantine: DiscoveryQuarantine
    discovery: Discovery
    openapi: OpenAPIAggregation
    elector: LeaderElector | None
    # kube mode: the cluster's authentication ConfigMap being watched (worker processes get copies)
    cluster_auth: AuthConfigMap | None = None
    # local mode: the folder's RBAC manifests being watched (worker processes get copies)
    rbac: RBACFolder | None = None


@dataclass(eq=False)
class Gateway:
    """One gateway process's components, typed; tests reach them directly (`build_gateway`)."""

    config: Config
    metrics: GatewayMetrics
    health: HealthChecks
    store: Store
    kube: KubeClient | None
    authenticator: Authenticator
    authorizer: Authorizer
    backends: BackendRegistry
    delegate: Delegate | None
    proxy: APIServiceProxy
    apiregistration: APIRegistration | None
    router: Router
    pipeline: Pipeline
    limits: MaxInFlight
    timeouts: RequestTimeouts
    auditor: Auditor | None
    # API Priority and Fairness (None with --enable-priority-and-fairness=false)
    flowcontrol: FlowControl | None
    in_flight: InFlight
    # Where the derived state comes from: this process (`Control`) or the control process (a worker).
    derived: Control | Replica
    # (name, component) in start order; stopped in reverse.
    components: list[tuple[str, Component]]
    # Human-readable start-up facts ("client certificates (CA ...)", "authorization: ...").
    auth_summary: list[str] = field(default_factory=list)
    # This gateway's loop mark on everything it sends (`backends/hops.py`).
    hop: str = ""
    shutting_down: bool = False

    @property
    def control(self) -> Control:
        """The components that derive state; a worker has none (they run in the control process)."""
        if not isinstance(self.derived, Control):
            raise AttributeError("a worker process derives nothing: its control process does")
        return self.derived

    @property
    def replica(self) -> Replica:
        """A worker's copy of the control process's state."""
        if not isinstance(self.derived, Replica):
            raise AttributeError("only a worker process of --workers N follows a control process")
        return self.derived

    async def start(self) -> None:
        await _start_all(self.components)

    async def stop(self) -> None:
        await _stop_all(self.components)

    def shutdown_check(self) -> str | None:
        """readyz `shutdown`: fails as soon as the process is asked to stop."""
        return "the gateway is shutting down" if self.shutting_down else None


async def _start_all(components: list[tuple[str, Component]]) -> None:
    started: list[tuple[str, Component]] = []
    try:
        for name, component in components:
            await component.start()
            started.append((name, component))
    except BaseException:
        await _stop_all(started)
        raise


async def _stop_all(components: list[tuple[str, Component]]) -> None:
    for name, component in reversed(components):
        try:
            await component.stop()
        except Exception:
            log.exception("stopping a component failed", extra={"fields": {"component": name}})


def build_gateway(
    config: Config,
    *,
    replica: Replica | None = None,
    metrics: GatewayMetrics | None = None,
    serving: bool = True,
) -> Gateway:
    """Wire every component the configuration asks for, each given its own part of it.

    With `replica`, the gateway of one worker process of `--workers N`: the same request path,
    with no object source, availability checks, discovery or OpenAPI fetches and no leader
    election; what those derive comes from the control process through `replica` (`workers/`),
    and `metrics` is the registry the replica reports to the control's scrapes.
    `serving=False`: the control process of `--workers N`, which never listens: its request path
    follows no APIService (the proxy's routes, handling and endpoints of each, and local mode's
    `apiregistration.k8s.io` identities, about 2 KB an APIService, would serve nothing).
    """
    # 1. observability and state
    metrics = metrics or GatewayMetrics.declare()
    health = HealthChecks()
    store = replica.store if replica is not None else Store()
    components: list[tuple[str, Component]] = []
    # --tracing-config-file: the request spans (stopped last: what is batched is exported); each
    # worker exports its own
    tracer = tracer_for(config.tracing, audit_id=AUDIT_ID.get)
    if tracer is not None:
        components.append(("tracing", tracer))
    # The audit log starts first and stops last: every request's final event is written. A worker
    # applies the policy; the control process writes the log (one owner of rotation).
    auditor = build_auditor(
        config.audit, metrics.audit, sink=replica.audit_sink() if replica is not None else None
    )
    if auditor is not None:
        components.append(("audit-log", AuditLog(auditor)))

    # 2. kube-apiserver and, in a single or control process, the object source
    kube = config.source.kube_client()
    if kube is not None:
        components.append(("kube-client", kube))
    sources = (
        _sources(config.source, store, kube, metrics.watches) if replica is None else Sources(None, None)
    )
    components += sources.components

    # 3. who is calling, and may they (caches stay per process; a worker's copies of the cluster's
    # ConfigMap and of the folder's RBAC are the control's)
    authentication = build_authentication(
        config.authentication,
        config.source,
        kube=kube,
        metrics=metrics.auth,
        cluster_copies=replica.cluster_auth if replica is not None else None,
    )
    authorization = build_authorization(
        config.authorization,
        config.source,
        anonymous=config.authentication.anonymous,
        kube=kube,
        metrics=metrics.auth,
        rbac_source=replica.rbac if replica is not None else None,
    )
    components += authentication.components + authorization.components
    authenticator, authorizer = authentication.authenticator, authorization.authorizer
    # API Priority and Fairness follows the cluster's or the folder's configuration; a worker, the
    # control's, with its share of the seats (started with the request path, step 7)
    flowcontrol = _flowcontrol(config, kube, metrics, replica)
    if sources.folder is not None:
        # What the folder holds but the gateway does not load (objects, RBAC, APF's objects):
        # /readyz?verbose notes (a warning, never unready) and aggregator_manifest_errors.
        rbac_problems = [authorization.rbac.problems] if authorization.rbac is not None else []
        apf_source = flowcontrol.source if flowcontrol is not None else None
        apf_problems = [apf_source.problems] if isinstance(apf_source, FolderConfig) else []
        problems = merged_problems(sources.folder.problems, *rbac_problems, *apf_problems)
        health.add_notes("readyz", ManifestReport(problems, metrics.registry).notes)

    # 4. the backends; every identity header the front-proxy configuration names is stripped,
    # including names the cluster's ConfigMap sets later; every request carries this gateway's
    # loop mark (a group's one mark: a probe the control sends through any worker is a loop), and
    # any request arriving with one is refused (proxy loops)
    hop = replica.hello.hop if replica is not None else new_instance()
    backends = build_backends(
        config.backends,
        store,
        metrics.backends,
        identity=_identity_policy(config.authentication.requestheader, authenticator),
        hop=hop,
    )
    components.append(("backends", backends))

    # 5. what derives state: availability (before the proxy that asks it), discovery, OpenAPI
    derived: Control | Replica
    if replica is None:
        derived = control = _control(config, store, kube, metrics, backends, sources, serving=serving)
        control.cluster_auth, control.rbac = authentication.cluster, authorization.rbac
        if control.elector is not None:
            components.append(("leader-election", control.elector))
        _report_expiry(metrics.exposition.certificate_expiry, backends.client_certificate)
        _follow_ca_expiry(metrics.exposition.certificate_expiry, authenticator)
        if config.backends.proxy_client_cert_file is None:
            components.append(("front-proxy-warning", MissingClientCertificateWarning(store)))
        availability: Availability = control.availability
        recheck: Recheck = control.availability
        ejections: EjectionReport = control.ejections
        aggregated: AggregatedEndpoint = control.discovery
        published: PublishedOpenAPI = control.openapi
        legacy = control.discovery.legacy
    else:
        derived = availability = recheck = ejections = published = aggregated = replica
        legacy = LegacyDiscovery(store, quarantine=replica)
        store.add_listener(legacy.on_store_event)
        replica.add_quarantine_listener(legacy.quarantine_changed)

    # 6. what serves requests; a request that cannot reach its backend has availability re-check it
    # (requests in flight are counted for a graceful shutdown, which ends watches and tunnels)
    forwarding = _forwarding(
        config.delegate_auth if config.source.kube_mode else None,
        kube,
        metrics.proxy,
        backends,
        _identity_policy(
            config.authentication.requestheader,
            authenticator,
            keep_impersonation=config.delegate_auth == FRONT_PROXY,
        ),
        recheck=recheck,
        hop=hop,
    )
    if forwarding.delegate is not None:
        components.append(("delegate", forwarding.delegate))
    if isinstance(derived, Control):
        components += _control_components(derived)
    apiregistration = _apiregistration(config.source.local_mode, store, follow=serving)
    discovery_routes = DiscoveryRoutes(legacy, aggregated, forwarding.fallback.handler)

    # 7. the request path: routes, the APIService proxy, gates
    if flowcontrol is not None:
        components.append(("priority-and-fairness", flowcontrol))
    path = build_request_path(
        config.requests,
        config.logging.access_log,
        local_mode=config.source.local_mode,
        store=store,
        metrics=metrics,
        health=health,
        forwarding=forwarding,
        backends=backends,
        availability=availability,
        authenticator=authenticator,
        authorizer=authorizer,
        auditor=auditor,
        hop=hop,
        metrics_route=Route(
            metrics.exposition.handle if replica is None else replica.serve_metrics, RouteKind.OWN, "metrics"
        ),
        routes=[discovery_routes, OpenAPIRoutes(published), *_local_routes(apiregistration, authorizer)],
        ejections=ejections,
        tracer=tracer,
        flowcontrol=flowcontrol,
        serving=serving,
    )
    components.append(("endpoint-probes", path.proxy.handling))

    gateway = Gateway(
        config=config,
        metrics=metrics,
        health=health,
        store=store,
        kube=kube,
        authenticator=authenticator,
        authorizer=authorizer,
        backends=backends,
        delegate=forwarding.delegate,
        proxy=path.proxy,
        apiregistration=apiregistration,
        router=path.router,
        pipeline=path.pipeline,
        limits=path.limits,
        timeouts=path.timeouts,
        auditor=auditor,
        flowcontrol=flowcontrol,
        in_flight=forwarding.in_flight,
        derived=derived,
        components=components,
        auth_summary=authentication.summary + authorization.summary,
        hop=hop,
    )
    health.add("ping", lambda: None)
    health.add("shutdown", gateway.shutdown_check, livez=False)
    # This process's own copy of the cluster's ConfigMap (a worker's too).
    _cluster_auth_check(health, authentication.cluster)
    if flowcontrol is not None and isinstance(flowcontrol.source, KubeConfig):
        # kube mode: not ready until the cluster's FlowSchemas and priority levels are held
        health.add(FLOWCONTROL_CHECK, flowcontrol.source.ready_check, livez=False)
    if replica is None:
        _control_checks(health, store, gateway.control, kube)
    else:
        _replica_checks(health, replica)
    return gateway


@dataclass(frozen=True)
class Sources:
    """Where a single or control process reads APIService, Service and EndpointSlice objects."""

    kube_source: KubeSource | None
    folder: FolderSource | None

    @property
    def components(self) -> list[tuple[str, Component]]:
        named: list[tuple[str, Component | None]] = [
            ("kube-source", self.kube_source),
            ("folder-source", self.folder),
        ]
        return [(name, component) for name, component in named if component is not None]


def _sources(source: SourceConfig, store: Store, kube: KubeClient | None, metrics: WatchMetrics) -> Sources:
    """The kube watch (kube mode) and/or the folder (local mode, or beside kube mode)."""
    kube_source = KubeSource(kube, store, metrics) if source.kube_mode and kube is not None else None
    folder = None
    if source.apiservices_dir is not None:
        folder = FolderSource(
            source.apiservices_dir, store, read_elsewhere=lambda doc: is_rbac(doc) or is_flowcontrol(doc)
        )
    return Sources(kube_source, folder)


def _control(
    config: Config,
    store: Store,
    kube: KubeClient | None,
    metrics: GatewayMetrics,
    backends: BackendRegistry,
    sources: Sources,
    *,
    serving: bool = True,
) -> Control:
    """Availability, discovery and OpenAPI, each subscribed to what it follows (`serving`: see
    `build_gateway`; a control that serves nothing keeps no legacy discovery documents).

    With --write-apiservice-status in kube mode a Lease elects the one replica that writes
    (started before the checker, so it stops after it and the Lease is released only once no
    status write can still be under way).
    """
    elector: LeaderElector | None = None
    if config.leader_election is not None and kube is not None:
        elector = elector_for(config.leader_election, kube, metrics.leader_election)
    sink = _status_sink(config, store, kube, elector or ALWAYS_LEADS)
    ejections = EjectionBook()
    # Discovery quarantine (opt-in per APIService): fed every verdict by the checker.
    quarantine = DiscoveryQuarantine(store, metrics.quarantine)
    store.add_listener(quarantine.on_store_event)
    availability = AvailabilityChecker(
        store,
        DiscoveryProbe(backends),
        metrics.availability,
        sink,
        ejections=ejections,
        quarantine=quarantine,
    )
    store.add_listener(availability.on_store_event)
    if elector is not None:
        elector.add_listener(availability.leadership_changed)
    discovery = Discovery(
        store,
        backends=backends,
        kube=kube if config.source.kube_mode else None,
        metrics=metrics.discovery,
        reachability=availability,
        quarantine=quarantine,
        legacy_documents=serving,
    )
    store.add_listener(discovery.on_store_event)
    # A verdict flip sends discovery and OpenAPI back to the backend at once: an APIService found
    # down goes Stale now, not at the next refresh, and Current again as soon as it is back. Until
    # then they do not dial what the checker found unreachable: one verdict per backend.
    availability.add_listener(discovery.fetcher.poke)
    openapi = OpenAPIAggregation(
        store,
        backends=backends,
        kube=kube,
        metrics=metrics.openapi,
        local_mode=config.source.local_mode,
        reachability=availability,
        quarantine=quarantine,
    )
    store.add_listener(openapi.on_store_event)
    availability.add_listener(openapi.apiservice_changed)
    # Entering or leaving quarantine re-renders discovery and OpenAPI; entering has the checker
    # record a verdict whose condition message says so.
    quarantine.add_listener(discovery.quarantine_changed)
    quarantine.add_listener(openapi.quarantine_changed)
    quarantine.add_listener(lambda name: availability.poke(name) if name in quarantine.quarantined else None)
    return Control(
        kube_source=sources.kube_source,
        folder=sources.folder,
        availability=availability,
        ejections=ejections,
        quarantine=quarantine,
        discovery=discovery,
        openapi=openapi,
        elector=elector,
    )


def _control_components(control: Control) -> list[tuple[str, Component]]:
    """Started after the backends they dial and the delegate, in this order."""
    return [
        ("discovery", control.discovery),
        ("openapi", control.openapi),
        ("availability", control.availability),
        ("discovery-quarantine", control.quarantine),
    ]


def _flowcontrol(
    config: Config, kube: KubeClient | None, metrics: GatewayMetrics, replica: Replica | None
) -> FlowControl | None:
    """API Priority and Fairness from the cluster's FlowSchemas and priority levels (kube mode), the
    folder's (local mode), or the bootstrap ones; in a worker, the control's configuration and this
    worker's share of the limits (`flowcontrol/sharing.py`)."""
    if config.flowcontrol is None:
        return None
    source: ConfigSource
    if replica is not None:
        source = HeldConfig()
    elif config.source.kube_mode and kube is not None:
        source = KubeConfig(kube)
    elif config.source.apiservices_dir is not None:
        source = FolderConfig(config.source.apiservices_dir)
    else:
        source = StaticConfig()
    # Declared only when APF runs, as kube-apiserver registers its apiserver_flowcontrol_* metrics.
    flowcontrol = build_flowcontrol(
        config.flowcontrol, source, FlowControlMetrics(metrics.registry), apiserver=metrics.apiserver
    )
    if replica is not None:
        flowcontrol.in_worker(replica.channel.send)
        replica.add_message_handler(flowcontrol.receive)
    return flowcontrol


def build_flowcontrol(
    config: FlowControlConfig, source: ConfigSource, metrics: FlowControlMetrics, *, apiserver: RequestMetrics
) -> FlowControl:
    """API Priority and Fairness (`--enable-priority-and-fairness`, the default) following `source`."""
    return FlowControl(
        source,
        server_concurrency_limit=config.server_concurrency_limit,
        metrics=metrics,
        apiserver=apiserver,
        request_timeout=config.request_timeout,
    )


def _control_checks(health: HealthChecks, store: Store, control: Control, kube: KubeClient | None) -> None:
    """The health checks of what a single or control process derives."""
    health.add("apiservice-registry-synced", store.synced_check, livez=False)
    # Ready once the first verdicts are in (a dead backend delays this by one probe timeout at
    # most; it never makes the gateway unready), and the unavailable ones listed in the notes.
    health.add(FIRST_ROUND_CHECK, control.availability.first_round_check, livez=False)
    health.add_notes("readyz", control.availability.notes)
    if control.discovery.delegate is not None:
        health.add(KUBE_DISCOVERY_CHECK, control.discovery.kube_ready, livez=False)
    if control.openapi.kube_mode and kube is not None:
        # kubectl explain of built-in types works from the first 200 (bounded: readiness.py).
        health.add(KUBE_OPENAPI_CHECK, control.openapi.kube_ready, livez=False)
    if control.elector is not None:
        # Never fails for a follower: who leads shows in `/readyz?verbose`, not in readiness.
        health.add(LEADER_CHECK, control.elector.check)
        health.add_notes("readyz", control.elector.notes)


def _replica_checks(health: HealthChecks, replica: Replica) -> None:
    """A worker's: its channel, then the control's checks by name (store synced, first
    availability round, kube-apiserver's discovery and OpenAPI, leader election) as it last
    reported them, and its notes."""
    health.add(CONTROL_CHECK, replica.channel_check, livez=False)
    for check in replica.hello.checks:
        health.add(check.name, replica.check(check.name), livez=check.livez, readyz=check.readyz)
    for endpoint in ENDPOINTS:
        health.add_notes(endpoint, replica.notes(endpoint))


def _cluster_auth_check(health: HealthChecks, cluster: AuthConfigMap | None) -> None:
    """Kube mode without CA flags: not ready until the cluster's authentication settings are held
    (before, every client certificate would be refused)."""
    if cluster is not None:
        health.add(CLUSTER_AUTH_CHECK, cluster.ready_check, livez=False)


@dataclass(frozen=True)
class Forwarding:
    """How requests leave the gateway: the forwarder (and its upgrade tunnel), the fallback for
    unserved paths, and the shutdown tracker that ends their long-running answers."""

    in_flight: InFlight
    forwarder: Forwarder
    delegate: Delegate | None
    fallback: Route


def _forwarding(
    delegate_auth: str | None,
    kube: KubeClient | None,
    metrics: ProxyMetrics,
    backends: BackendRegistry,
    identity: LiveIdentityPolicy,
    *,
    recheck: Recheck,
    hop: str,
) -> Forwarding:
    """The proxy's hot path and its upgrade tunnel (a failed request has `recheck` look at its
    APIService again), and everything the gateway does not serve itself: kube-apiserver in kube
    mode (`delegate_auth` says how the caller's identity reaches it), a 404 in local mode."""
    in_flight = InFlight()
    tunnel = UpgradeTunnel(metrics, recheck=recheck, in_flight=in_flight)
    forwarder = Forwarder(metrics, tunnel, recheck=recheck, in_flight=in_flight)
    if delegate_auth is None or kube is None:
        return Forwarding(in_flight, forwarder, None, Route(serve_not_found, RouteKind.OWN, "not-found"))
    delegate = Delegate(
        kube,
        mode=delegate_auth,
        forwarder=forwarder,
        client_certificate=backends.client_certificate,
        identity=identity,
        hop=hop,
    )
    return Forwarding(in_flight, forwarder, delegate, delegate.route)


def _own_routes(local_mode: bool, fallback: Route, health: HealthChecks, metrics: Route) -> Router:
    """The router with the gateway's own endpoints: health, metrics, and local mode's /version."""
    router = Router(fallback)
    for endpoint in ENDPOINTS:
        route = Route(health.handler(endpoint), RouteKind.OWN, endpoint, public=True)
        router.add_exact(f"/{endpoint}", route)
        router.add_prefix(f"/{endpoint}/", route)
    router.add_exact("/metrics", metrics)
    if local_mode:
        router.add_exact("/version", Route(serve_version, RouteKind.OWN, "version"))
    return router


class RouteInstaller(Protocol):
    """A feature that serves some paths (discovery, OpenAPI, the APIService API)."""

    def install(self, router: Router) -> None: ...


@dataclass(frozen=True)
class RequestPath:
    """What serves every request of one gateway process, single or worker (`build_request_path`)."""

    router: Router
    proxy: APIServiceProxy
    pipeline: Pipeline
    limits: MaxInFlight
    timeouts: RequestTimeouts


def build_request_path(
    requests: RequestLimits,
    access_log: AccessLogPolicy,
    *,
    local_mode: bool,
    store: Store,
    metrics: GatewayMetrics,
    health: HealthChecks,
    forwarding: Forwarding,
    backends: BackendRegistry,
    availability: Availability,
    authenticator: Authenticator,
    authorizer: Authorizer,
    auditor: Auditor | None,
    hop: str,
    metrics_route: Route,
    routes: Sequence[RouteInstaller],
    ejections: EjectionReport | None = None,
    tracer: RequestTracer | None = None,
    flowcontrol: FlowControl | None = None,
    serving: bool = True,
) -> RequestPath:
    """The request path of every gateway process, single, control or worker: the router (the
    gateway's own paths, the features' `routes`, then the APIService proxy's claim), and the
    pipeline in kube-apiserver's filter order (server/config.go DefaultBuildHandlerChain): the
    request deadline around everything, then authentication, audit, impersonation, API Priority
    and Fairness or max-in-flight (after impersonation: system:masters is the impersonated user's
    group), authorization;
    before them, looped requests and paths a backend could read as another resource are refused.
    A feature that is off has no stage: no audit policy, no audit gate; no limits, no
    max-in-flight gate; no timeouts, no deadline. A process that never listens (`serving=False`:
    the control of `--workers N`) keeps its proxy out of the store's and availability's events,
    so it builds nothing per APIService."""
    router = _own_routes(local_mode, forwarding.fallback, health, metrics_route)
    for installer in routes:
        installer.install(router)
    timeouts = RequestTimeouts(
        metrics.apiserver,
        request_timeout=requests.request_timeout,
        min_request_timeout=requests.min_request_timeout,
    )
    proxy = APIServiceProxy(
        store,
        availability=availability,
        handling=HandlingTable(
            store, backends, metrics=forwarding.forwarder.endpoint_metrics, report=ejections
        ),
        forwarder=forwarding.forwarder,
        fallback=forwarding.fallback.handler,
        recheck=forwarding.forwarder.recheck,
        timeouts=timeouts,
    )
    if serving:
        store.add_listener(proxy.on_store_event)
        availability.add_listener(proxy.availability_changed)
        backends.client_certificate.add_listener(proxy.client_certificate_changed)
    router.add_claim(proxy.claim)

    access_lines = AccessLog(access_log)
    limits = MaxInFlight(
        metrics.apiserver,
        read_only=requests.max_requests_inflight,
        mutating=requests.max_mutating_requests_inflight,
    )
    instrumentation = RequestInstrumentation(metrics.apiserver)
    auditing = RequestAuditing(auditor) if auditor is not None else None
    # Tracing hooks: with --tracing-config-file, authentication and authorization run in their phase
    # spans (a request that is not sampled pays one attribute read each).
    authenticate: Gate = authenticator.gate
    authorize: Gate = authorizer.gate
    if tracer is not None:
        authenticate = traced_gate(AUTHENTICATION, authenticate)
        authorize = traced_gate(AUTHORIZATION, authorize)
    gates: list[Gate] = [loop_gate(hop), refuse_confusing_paths, authenticate]
    finishers: list[Finisher] = []
    if auditing is not None:
        gates.append(auditing.gate)
    gates.append(Impersonator(authorizer).gate)
    head_listeners = [limit_unauthenticated_http2] + (
        [auditing.head_going_out] if auditing is not None else []
    )
    if flowcontrol is not None:  # API Priority and Fairness in place of max-in-flight
        apf = flowcontrol.filter
        prioritize: Gate = apf.gate
        if tracer is not None:  # a queued request's wait shows as the phase's length
            prioritize = traced_gate(PRIORITY_AND_FAIRNESS, prioritize)
        gates.append(prioritize)
        finishers.append(apf.finished)
        head_listeners.append(apf.head_going_out)
    elif limits.enabled:
        gates.append(limits.gate)
        finishers.append(limits.finished)
    gates += [authorize, upgrade_gate(metrics.proxy), instrumentation.gate]  # last: the handler runs
    finishers.append(instrumentation.finished)
    if auditing is not None:
        finishers.append(auditing.finished)
    if tracer is not None:
        finishers.append(tracer.finished)  # tracing hook: the request's span ends with its status
    pipeline = Pipeline(
        router,
        Increments(metrics.pipeline.requests),
        access_lines,
        in_flight=forwarding.in_flight,
        timeouts=timeouts if timeouts.enabled else None,
        gates=tuple(gates),
        head_listeners=tuple(head_listeners),
        finishers=tuple(finishers),
        tracer=tracer,
    )
    return RequestPath(router, proxy, pipeline, limits, timeouts)


def _local_routes(apiregistration: APIRegistration | None, authorizer: Authorizer) -> list[RouteInstaller]:
    """Local mode's own APIs: `apiregistration.k8s.io/v1` and the self reviews of `kubectl auth can-i`."""
    if apiregistration is None:
        return []
    return [apiregistration, SelfReviews(authorizer)]


def _apiregistration(local_mode: bool, store: Store, *, follow: bool = True) -> APIRegistration | None:
    """Local mode serves `apiregistration.k8s.io/v1` itself (kube mode: kube-apiserver does);
    a process that serves no request does not `follow` the store."""
    if not local_mode:
        return None
    apiregistration = APIRegistration(store)
    if follow:
        store.add_listener(apiregistration.on_store_event)
    return apiregistration


def build_backends(
    flags: BackendConfig,
    store: Store,
    metrics: BackendMetrics,
    *,
    identity: LiveIdentityPolicy,
    hop: str | None = None,
) -> BackendRegistry:
    """The backends as configured (also what `aggregator check` dials with: its requests carry a
    loop mark too, so a check of an APIService served by a gateway says ProxyLoop); `identity`
    names the headers never forwarded."""
    client_certificate = ProxyClientCertificate(flags.proxy_client_cert_file, flags.proxy_client_key_file)
    backends = BackendRegistry(
        store,
        metrics,
        resolver=AddressResolver(
            store,
            endpoint_routing=flags.enable_aggregator_routing,
            allow_external_name=flags.allow_external_name_services,
            deny_cidrs=flags.deny_cidrs,
        ),
        client_certificate=client_certificate,
        identity=identity,
        hop=hop or new_instance(),
    )
    # A new front-proxy client certificate retires every backend; an APIService's new TLS
    # settings retire its own.
    client_certificate.add_listener(backends.retire_all)
    store.add_listener(backends.on_store_event)
    return backends


def flag_identity_policy(
    requestheader: RequestHeaderOptions, *, keep_impersonation: bool = False
) -> LiveIdentityPolicy:
    """The identity headers never forwarded: the standard names and the `--requestheader-*` flags'."""
    return LiveIdentityPolicy(requestheader, keep_impersonation=keep_impersonation)


def _identity_policy(
    requestheader: RequestHeaderOptions, authenticator: Authenticator, *, keep_impersonation: bool = False
) -> LiveIdentityPolicy:
    """The flags' names plus whatever front-proxy configuration the authenticator reads now
    (kube mode: the cluster's ConfigMap, which may change while the gateway runs)."""
    policy = flag_identity_policy(requestheader, keep_impersonation=keep_impersonation)
    policy.follow(authenticator.requestheader)
    return policy


def _report_expiry(expiry: CertificateExpiry, certificate: ProxyClientCertificate) -> None:
    """`aggregator_certificate_expiration_seconds{certificate="proxy-client"}`, now and on every reload."""

    def report() -> None:
        if certificate.pair is not None and certificate.cert_file:
            expiry.set_certificates(PROXY_CLIENT, certificate.cert_file, [certificate.pair.leaf])

    report()
    certificate.add_listener(report)


def _follow_ca_expiry(expiry: CertificateExpiry, authenticator: Authenticator) -> None:
    """`aggregator_certificate_expiration_seconds` for the client CAs the authenticator trusts now
    (a flag's file, re-read on change, or kube mode's ConfigMap)."""

    def pool_source(pool: CAPool | None) -> CertificateSource | None:
        if pool is None:
            return None
        source = AUTHENTICATION_CONFIGMAP if pool.source.startswith("configmap ") else pool.source
        return source, pool.anchors

    def requestheader() -> CertificateSource | None:
        config = authenticator.requestheader()
        return pool_source(config.pool if config is not None else None)

    expiry.follow(CLIENT_CA, lambda: pool_source(authenticator.client_ca()))
    expiry.follow(REQUESTHEADER_CLIENT_CA, requestheader)


def _status_sink(config: Config, store: Store, kube: KubeClient | None, leadership: Leadership) -> StatusSink:
    """Where Available conditions go: the store (local mode), kube-apiserver (opt-in, written by
    the Lease holder only), or memory."""
    if config.source.local_mode:
        return StoreStatus(store)
    if config.write_apiservice_status and kube is not None:
        return KubeStatusWriter(kube, store, leadership)
    return MemoryStatus()
