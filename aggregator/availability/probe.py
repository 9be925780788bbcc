"""Walk one APIService's way to its backend, hop by hop, in upstream's order
(kube-aggregator `remote_available_controller.go`, `sync`).

Service present -> (ClusterIP only) the port `spec.service.port` exists -> an EndpointSlice has a
ready endpoint with that port's name -> `GET /apis/<g>/<v>` as `system:kube-aggregator` in
`system:masters`: 5 attempts at once, 5 s each, the first 2xx wins, redirects are not followed.

Each hop leaves a `Step` (what `aggregator check` prints) and the walk ends in a `Verdict` (the
`Available` condition the checker records). The GET goes through the proxy's own transport
(the backend registry: the same resolution, deny list, caBundle/SNI verification and front-proxy
client certificate as proxied requests), so "available" means "the proxy can reach it". Upstream's
check skips certificate verification; ours does not, because a certificate the proxy refuses
makes every request fail even when the check passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import ssl
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import KW_ONLY, dataclass, field
from http import HTTPStatus
from typing import Any

from cryptography import x509

from aggregator.availability import conditions as cond
from aggregator.availability.conditions import Verdict
from aggregator.backends import tlsdiag
from aggregator.backends.addresses import Target
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.hops import LOOP_STATUS
from aggregator.backends.registry import BackendRegistry
from aggregator.backends.tls import client_context
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.fielderrors import go_quote
from aggregator.model.objects import EndpointSlice, Service
from aggregator.model.userinfo import AGGREGATOR
from aggregator.sources.store import Kind, Store
from aggregator.tls.pem import PEMError, parse_certificates
from aggregator.util.hostport import join_host_port

ATTEMPTS = 5
TIMEOUT = 5.0
# The other attempts start when the first has failed or not answered within this many seconds.
HEDGE_AFTER = 1.0
# Enough for any discovery document; the checker itself only needs the status.
MAX_BODY = 8 * 1024 * 1024
TIMEOUT_CAUSE = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
PASSED = cond.passed()

# Why a kind of object cannot be read right now (a failed one-shot list), or None when it can.
AccessError = Callable[[Kind], str | None]

PASS, FAIL, SKIP = "pass", "fail", "skip"
# How much of a failed answer's body an explanation depends on (its excerpt is shorter).
EXPLAINED_BODY = 4096
HTTP_HOP = "http"  # a backend answered, with a status outside 2xx
DISCOVERY_HOP = "discovery"  # the 2xx body is not the group-version's APIResourceList


@dataclass(frozen=True, slots=True)
class Step:
    """One hop as a person reads it: `hop`, pass/fail/skip, a one-line summary, detail lines."""

    hop: str
    state: str
    summary: str
    detail: tuple[str, ...] = ()


@dataclass
class Report:
    """Everything one check found: the steps taken and the resulting verdict."""

    name: str
    verdict: Verdict
    steps: list[Step] = field(default_factory=list)
    # The 2xx discovery body, when the GET succeeded (the CLI decodes it).
    body: bytes | None = None
    # The backend could not be reached at all (a missing Service, port or endpoint, a refused or
    # hung connection, a failed handshake), as opposed to reached and answering badly.
    unreachable: bool = False

    @property
    def failed_step(self) -> Step | None:
        return next((s for s in self.steps if s.state == FAIL), None)


Explained = tuple[Verdict, list[Step]]


@dataclass
class Attempt:
    """One GET: where it went and what came back (a status, or the error that stopped it)."""

    target: Target | None = None
    url: str = ""
    status: int | None = None
    body: bytes = b""
    error: BackendError | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def discovery_path(svc: APIService) -> str:
    """`/apis/<g>/<v>`, or `/api/<v>` for the legacy `v1.` APIService."""
    return f"/api/{svc.version}" if not svc.group else f"/apis/{svc.group}/{svc.version}"


def _svc_name(ref: ServiceReference) -> str:
    return f"{ref.namespace}/{ref.name}"


def _ports_text(service: Service) -> str:
    if not service.ports:
        return "none"
    return ", ".join(f"{p.port} ({go_quote(p.name)})" if p.name else str(p.port) for p in service.ports)


def _ready(slices: Sequence[EndpointSlice], port_name: str) -> list[tuple[str, str]]:
    """(address:port, slice) of every ready endpoint in slices with a port named `port_name`."""
    found = []
    for eps in slices:
        ports = [p.port for p in eps.ports if p.name is not None and p.name == port_name and p.port is not None]
        if not ports:
            continue
        for endpoint in eps.endpoints:
            if endpoint.ready is False:
                continue
            for address in endpoint.addresses[:1]:
                found.append((join_host_port(address, ports[0]), eps.name))
    return found


def _objects_pass(svc: APIService, store: Store) -> bool:
    """Whether `check_objects` would find no failing hop (without putting any of it into words)."""
    ref = svc.service
    assert ref is not None
    service = store.service(ref.namespace, ref.name)
    if service is None:
        return False
    if service.type != "ClusterIP":
        return True
    port = service.port_by_number(ref.port)
    if port is None:
        return False
    return _has_ready_endpoint(store.endpointslices_for(ref.namespace, ref.name), port.name)


def _has_ready_endpoint(slices: Sequence[EndpointSlice], port_name: str) -> bool:
    """Upstream's `hasAvailableEndpoint`: a slice with a ready (or unknown) endpoint and the named port.

    (Plain loops: it runs on every check of every APIService, dead ones included.)"""
    for eps in slices:
        for e in eps.endpoints:
            if e.ready is None or e.ready:
                break
        else:
            continue
        for p in eps.ports:
            if p.name is not None and p.name == port_name and p.port is not None:
                return True
    return False


def _slices_text(slices: Sequence[EndpointSlice]) -> str:
    parts = []
    for eps in slices:
        names = ", ".join(go_quote(p.name or "") for p in eps.ports) or "none"
        ready = sum(1 for e in eps.endpoints if e.ready is not False)
        parts.append(f"{eps.name} (port names {names}; {len(eps.endpoints)} endpoints, {ready} ready)")
    return "; ".join(parts)


def check_objects(
    svc: APIService, store: Store, access: AccessError | None = None
) -> tuple[list[Step], Verdict | None]:
    """The hops upstream checks from its caches: Service, port, EndpointSlices.

    Returns the steps and, when one failed, the verdict (None means go on to the GET).
    """
    ref = svc.service
    assert ref is not None
    steps: list[Step] = []
    service = store.service(ref.namespace, ref.name)
    if service is None:
        err = access(Kind.SERVICE) if access is not None else None
        if err is not None:
            steps.append(Step("service", FAIL, f"cannot read Services: {err}"))
            return steps, cond.service_access_error(ref, err)
        steps.append(Step("service", FAIL, f"service {_svc_name(ref)} not found"))
        return steps, cond.service_not_found(ref)
    where = f", cluster IP {service.cluster_ip}" if service.cluster_ip else ""
    if service.type == "ExternalName":
        where = f", externalName {service.external_name}"
    steps.append(Step("service", PASS, f"{_svc_name(ref)} exists (type {service.type}{where})"))
    if service.type != "ClusterIP":
        note = f"not checked for {service.type} Services (as upstream)"
        steps += [Step("port", SKIP, note), Step("endpoints", SKIP, note)]
        return steps, None

    port = service.port_by_number(ref.port)
    if port is None:
        ports = f"service ports: {_ports_text(service)}"
        steps.append(Step("port", FAIL, f"no port {ref.port} on the Service", (ports,)))
        return steps, cond.service_port_error(ref, [ports])
    target_port = f", targetPort {port.target_port}" if port.target_port is not None else ""
    steps.append(Step("port", PASS, f"port {ref.port} exists (name {go_quote(port.name)}{target_port})"))

    slices = store.endpointslices_for(ref.namespace, ref.name)
    if not slices:
        err = access(Kind.ENDPOINTSLICE) if access is not None else None
        if err is not None:
            steps.append(Step("endpoints", FAIL, f"cannot read EndpointSlices: {err}"))
            return steps, cond.endpoints_access_error(ref, err)
        label = f"no EndpointSlice labelled kubernetes.io/service-name={ref.name} in {ref.namespace}"
        steps.append(Step("endpoints", FAIL, label))
        return steps, cond.endpoints_not_found(ref)
    if not _has_ready_endpoint(slices, port.name):
        found = f"slices: {_slices_text(slices)}"
        steps.append(
            Step("endpoints", FAIL, f"no ready address with port name {go_quote(port.name)}", (found,))
        )
        return steps, cond.missing_endpoints(ref, port.name, [found])
    ready = _ready(slices, port.name)
    shown = ", ".join(a for a, _ in ready[:5]) + (f" and {len(ready) - 5} more" if len(ready) > 5 else "")
    steps.append(
        Step(
            "endpoints",
            PASS,
            f"{len(ready)} ready address{'es' if len(ready) != 1 else ''} with port name "
            f"{go_quote(port.name)}: {shown or 'unknown'}",
        )
    )
    return steps, None


def ca_source(svc: APIService) -> str:
    """Which certificates a backend's serving certificate is verified against."""
    if svc.insecure_skip_tls_verify:
        return "none: insecureSkipTLSVerify is set, the certificate is not verified"
    return _bundle_source(svc.ca_bundle)


@functools.lru_cache(maxsize=1024)
def _bundle_source(ca_bundle: bytes) -> str:
    """(Cached: every check of every APIService describes its bundle, which rarely changes.)"""
    if not ca_bundle:
        return "the system roots (spec.caBundle is empty)"
    try:
        certs = parse_certificates(ca_bundle, source="spec.caBundle")
    except PEMError as err:
        return f"spec.caBundle, which cannot be used: {err}"
    return "spec.caBundle: " + ", ".join(c.subject.rfc4514_string() or "(empty subject)" for c in certs)


def certificate_detail(cert: x509.Certificate | None, server_name: str) -> list[str]:
    """What the serving certificate holds, next to what it had to hold."""
    if cert is None:
        return [f"expected name: {server_name}", "certificate: could not be read for a closer look"]
    names = tlsdiag.certificate_names(cert)
    return [
        f"expected name: {server_name}",
        f"certificate names: {', '.join(names) if names else 'none (no subject alternative names)'}",
        f"certificate issuer: {cert.issuer.rfc4514_string() or '(empty)'}",
        f"certificate valid: {_utc(cert.not_valid_before_utc)} to {_utc(cert.not_valid_after_utc)}",
    ]


def _utc(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def tls_summary(svc: APIService) -> str:
    """What a completed handshake established."""
    assert svc.service is not None
    if svc.insecure_skip_tls_verify:
        return "handshake completed; certificate not verified (insecureSkipTLSVerify)"
    return f"certificate verified for {svc.service.server_name}"


@dataclass(eq=False)
class DiscoveryProbe:
    """The GET hop: hedged attempts through the proxy's own transport, and the words for what failed."""

    backends: BackendRegistry
    _: KW_ONLY
    attempts: int = ATTEMPTS
    timeout: float = TIMEOUT
    hedge_after: float = HEDGE_AFTER
    _diag: tuple[int, ssl.SSLContext] | None = field(default=None, init=False)
    # The last explanation per APIService, reused while the same objects fail the same way: a
    # dead backend is re-checked every 30 s, and its words do not change between checks.
    _explained: dict[str, tuple[APIService, Service | None, tuple[object, ...], Explained]] = field(
        default_factory=dict, init=False
    )

    # --- the attempts ------------------------------------------------------------------------------

    async def attempt(
        self, svc: APIService, path: str, *, deadline: float | None = None, target: Target | None = None
    ) -> Attempt:
        """One GET, as `BackendRegistry.fetch` makes it, to `target` or wherever a request would
        go, keeping the address it dialed; it ends at `deadline` (loop time) or after the probe
        timeout."""
        backends = self.backends
        result = Attempt()
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.timeout
        try:
            async with asyncio.timeout_at(deadline):
                result.target = target = target or await backends.resolve(svc)
                result.url = target.base_url + path
                response = await backends.get_from(
                    svc, target, path, headers={}, user=AGGREGATOR, max_body=MAX_BODY
                )
                result.status, result.body = response.status, response.body
        except BackendError as err:  # resolution: upstream reports the resolver's error as it is
            result.error = err
        except TimeoutError:
            result.error = BackendError(Hop.TIMEOUT, TIMEOUT_CAUSE, url=result.url)
        return result

    async def run(self, svc: APIService, path: str, *, attempts: int | None = None) -> tuple[Attempt, int]:
        """Up to `attempts` GETs (default: the probe's); the first 2xx wins, else the last to
        finish. Also: how many failed.

        Upstream starts its 5 attempts at once, each on a new connection. Here the first goes
        alone, on a pooled connection when there is one; the others start only if it fails or has
        not answered within `hedge_after` seconds. A healthy backend costs one request per check
        instead of five handshakes, and a flaky one still gets every chance upstream gives it.
        Every attempt ends when the first one's timeout does, as upstream's parallel ones do.

        With endpoint routing and several ready endpoints, the attempts go to different endpoints
        (every one of them, up to the probe's number, even when `attempts` asks for fewer): the
        APIService is available while any endpoint answers, as the proxy's balancer sees it.
        Upstream resolves once per check and sends all five to one random endpoint, so one dead
        replica of three marks the whole APIService unavailable a third of the time.
        """
        attempts = self.attempts if attempts is None else attempts
        spread = self._spread(svc)
        if spread:
            attempts = max(attempts, min(len(spread), self.attempts))
        deadline = asyncio.get_running_loop().time() + self.timeout

        def start(index: int) -> Coroutine[Any, Any, Attempt]:
            target = spread[index % len(spread)] if spread else None
            return self.attempt(svc, path, deadline=deadline, target=target)

        if attempts <= 1:  # nothing to hedge with: no task, no extra timer
            result = await start(0)
            return result, 0 if result.ok else 1
        tasks = [asyncio.ensure_future(start(0))]
        last = Attempt(error=BackendError(Hop.CONNECT, "no attempt was made"))
        failed = 0
        try:
            done, _ = await asyncio.wait(tasks, timeout=self.hedge_after)
            if done and tasks[0].result().ok:
                return tasks[0].result(), 0
            tasks += [asyncio.ensure_future(start(index)) for index in range(1, attempts)]
            for next_done in asyncio.as_completed(tasks):
                result = await next_done
                if result.ok:
                    return result, failed
                failed += 1
                last = result
        finally:
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:  # (a healthy backend's one attempt is done: no gather, no extra turn of the loop)
                await asyncio.gather(*pending, return_exceptions=True)
        return last, failed

    def _spread(self, svc: APIService) -> list[Target]:
        """The distinct endpoints the attempts go to in turn; empty: each attempt resolves as a
        request does (one cluster IP, one endpoint, an ExternalName, an error to report)."""
        resolver = self.backends.resolver
        if not resolver.endpoint_routing:
            return []
        targets = resolver.addresses(svc).spread(resolver.rng)
        return targets if len(targets) > 1 else []

    # --- the words ---------------------------------------------------------------------------------

    def route(self, svc: APIService, store: Store) -> str:
        """How the dialed address was chosen (cluster IP, endpoint, ExternalName)."""
        ref = svc.service
        assert ref is not None
        service = store.service(ref.namespace, ref.name)
        if service is not None and service.type == "ExternalName":
            return f"an address of ExternalName {service.external_name} of service {_svc_name(ref)}"
        if self.backends.resolver.endpoint_routing:
            return f"a ready endpoint of service {_svc_name(ref)} (--enable-aggregator-routing)"
        return f"the cluster IP of service {_svc_name(ref)}"

    def _diag_context(self) -> ssl.SSLContext:
        """Unverified, with the front-proxy client certificate: only to look at a certificate."""
        cert = self.backends.client_certificate
        if self._diag is None or self._diag[0] != cert.generation:
            self._diag = (cert.generation, client_context(None, insecure=True, client_pair=cert.pair))
        return self._diag[1]

    async def peer_certificate(self, target: Target) -> x509.Certificate | None:
        return await tlsdiag.peer_certificate(
            target.ip, target.port, target.server_name, self._diag_context()
        )

    def client_certificate_text(self) -> str:
        pair = self.backends.client_certificate.pair
        if pair is None:
            return "client certificate: none (--proxy-client-cert-file is not set)"
        leaf = pair.leaf
        return f"client certificate: {leaf.subject.rfc4514_string()} (issuer {leaf.issuer.rfc4514_string()})"

    def forget(self, name: str) -> None:
        """The APIService is gone: drop its last explanation."""
        self._explained.pop(name, None)

    async def explain(self, svc: APIService, store: Store, attempt: Attempt) -> Explained:
        """The verdict for a failed attempt (FailedDiscoveryCheck, or the refusal it was:
        ForbiddenEndpoint, RedirectRejected, ProxyLoop), and its steps from `address` on."""
        ref = svc.service
        assert ref is not None
        service = store.service(ref.namespace, ref.name)
        error = attempt.error
        signature = (
            attempt.target,
            attempt.url,
            attempt.status,
            attempt.body[:EXPLAINED_BODY],
            None if error is None else (error.hop, error.cause, error.url, error.certificate),
            self.backends.client_certificate.generation,
        )
        cached = self._explained.get(svc.name)
        if cached is not None and cached[0] is svc and cached[1] is service and cached[2] == signature:
            return cached[3]
        explained = self._explain(svc, store, attempt)
        self._explained[svc.name] = (svc, service, signature, explained)
        return explained

    def _explain(self, svc: APIService, store: Store, attempt: Attempt) -> Explained:
        ref = svc.service
        assert ref is not None
        target, url, error = attempt.target, attempt.url, attempt.error
        steps: list[Step] = []
        detail: list[str] = []
        dialed = f"dialed: {target.authority} ({self.route(svc, store)})" if target is not None else ""
        if target is not None:
            steps.append(Step("address", PASS, f"{target.authority}, {self.route(svc, store)}"))

        if attempt.status is not None and target is not None:  # the backend answered, outside 2xx
            status = attempt.status
            reason, hop, answer = cond.FAILED_DISCOVERY_CHECK, HTTP_HOP, []
            if 300 <= status < 400:  # even a 304: this GET was not conditional
                reason, hop, answer = (
                    cond.REDIRECT_REJECTED,
                    Hop.REDIRECT.value,
                    ["redirects are not followed"],
                )
            elif status == LOOP_STATUS:
                reason, answer = cond.PROXY_LOOP, ["the backend is an aggregator gateway: a proxy loop"]
            message = f"failing or missing response from {url}: bad status from {url}: {status}"
            status_text = _status_text(status)
            answer.append(f"body: {cond.body_excerpt(attempt.body)}")
            detail = [f"hop: {hop}", dialed, f"status: {status_text}", *answer]
            steps += [
                Step("connect", PASS, f"connected to {target.authority}"),
                Step("tls", PASS, tls_summary(svc)),
                Step(HTTP_HOP, FAIL, f"GET {discovery_path(svc)}: {status_text}", tuple(answer)),
            ]
            return cond.failed_discovery_check(message, detail, reason=reason), steps

        assert error is not None
        cause = error.cause
        hop = error.hop
        tls_lines: list[str] = []
        if error.verification and target is not None:
            tls_lines = [
                *certificate_detail(error.certificate, target.server_name),
                f"trusted CA: {ca_source(svc)}",
            ]
        elif (
            target is not None and hop is Hop.CONNECT and (cause == "EOF" or cause.endswith("reset by peer"))
        ):  # no TLS alert to read; a refused client certificate can look just like this
            tls_lines = [
                "the backend closed the connection without answering",
                self.client_certificate_text(),
            ]
        elif hop is Hop.TLS:
            tls_lines = [self.client_certificate_text(), f"trusted CA: {ca_source(svc)}"]
        elif hop is Hop.TRANSPORT:
            tls_lines = [f"trusted CA: {ca_source(svc)}"]

        # Without a URL it is the resolver's (or TLS settings') error, reported as it is (upstream).
        message = f"failing or missing response from {url}: {error}" if error.url else cause
        detail = [f"hop: {hop.value}", dialed, *tls_lines]
        if hop is Hop.TIMEOUT:
            detail.append(f"no response within {self.timeout:g}s")
        reason = cond.FORBIDDEN_ENDPOINT if hop is Hop.DENY_CIDR else cond.FAILED_DISCOVERY_CHECK
        verdict = cond.failed_discovery_check(message, detail, reason=reason)

        if target is None and hop in (Hop.SERVICE, Hop.PORT, Hop.ENDPOINTS, Hop.DENY_CIDR, Hop.CONNECT):
            steps.append(Step("address", FAIL, cause, (f"hop: {hop.value}",)))
            return verdict, steps
        if hop is Hop.TRANSPORT:
            steps += [
                Step("connect", SKIP, "not attempted"),
                Step("tls", FAIL, cause, tuple(tls_lines)),
            ]
        elif hop is Hop.CONNECT:
            steps.append(Step("connect", FAIL, cause))
        elif hop is Hop.TLS:
            steps += [
                Step("connect", PASS, f"connected to {target.authority if target else '?'}"),
                Step("tls", FAIL, cause, tuple(tls_lines)),
            ]
        else:  # timeout: the connection, the handshake or the response headers did not come in time
            steps.append(
                Step(
                    HTTP_HOP,
                    FAIL,
                    f"no response within {self.timeout:g}s (TCP connect, TLS handshake or response headers)",
                )
            )
        return verdict, steps


def _status_text(code: int) -> str:
    with contextlib.suppress(ValueError):
        return f"{code} {HTTPStatus(code).phrase}"
    return str(code)


async def check_apiservice(
    svc: APIService,
    store: Store,
    probe: DiscoveryProbe,
    *,
    access: AccessError | None = None,
    inspect_tls: bool = False,
    detail: bool = True,
    attempts: int | None = None,
) -> Report:
    """Every hop for one APIService, in upstream's order, ending in its verdict.

    `detail=False` (the checker, every 30 s for every APIService, dead ones included) builds no
    steps when the objects' hops pass: the report is the verdict, worded in full, and whether the
    backend was reached. `attempts` overrides the probe's number of GETs.
    """
    if not detail and svc.service is not None and _objects_pass(svc, store):
        quick, _failed = await probe.run(svc, discovery_path(svc), attempts=attempts)
        if quick.ok:
            return Report(svc.name, PASSED, body=quick.body)
        # The objects' hops passed (`_objects_pass`): only the GET's failure needs words.
        failed_verdict, _steps = await probe.explain(svc, store, quick)
        return Report(svc.name, failed_verdict, unreachable=quick.status is None)
    if svc.service is None:
        return Report(
            svc.name, cond.local(), [Step("apiservice", PASS, "local: served by kube-apiserver itself")]
        )
    ref = svc.service
    steps = [Step("apiservice", PASS, f"remote: service {_svc_name(ref)} port {ref.port}")]
    object_steps, verdict = check_objects(svc, store, access)
    steps += object_steps
    if verdict is not None:
        return Report(svc.name, verdict, steps, unreachable=True)
    path = discovery_path(svc)
    attempt, failed = await probe.run(svc, path, attempts=attempts)
    if not attempt.ok:
        verdict, more = await probe.explain(svc, store, attempt)
        return Report(svc.name, verdict, steps + more, unreachable=attempt.status is None)
    target = attempt.target
    assert target is not None
    steps.append(Step("address", PASS, f"{target.authority}, {probe.route(svc, store)}"))
    steps.append(Step("connect", PASS, f"connected to {target.authority}"))
    tls_detail: tuple[str, ...] = (f"trusted CA: {ca_source(svc)}",)
    if inspect_tls:
        cert = await probe.peer_certificate(target)
        tls_detail = (*certificate_detail(cert, target.server_name), *tls_detail)
    steps.append(Step("tls", PASS, tls_summary(svc), tls_detail))
    assert attempt.status is not None
    note = (f"{failed} of {probe.attempts} attempts failed before this one answered",) if failed else ()
    steps.append(
        Step(
            HTTP_HOP,
            PASS,
            f"GET {path} as {AGGREGATOR.name} ({', '.join(AGGREGATOR.groups)}): {_status_text(attempt.status)}",
            note,
        )
    )
    return Report(svc.name, cond.passed(), steps, body=attempt.body)
