"""What the proxy knows about each APIService it serves, prepared ahead of the requests.

kube-aggregator keeps one `proxyHandlingInfo` per APIService (handler_proxy.go), rebuilt by
`updateAPIService` when the APIService changes, so that `ServeHTTP` only reads it. `HandlingInfo`
is the gateway's: the APIService, the backend (its TLS context and connection pool, or why the
TLS settings cannot be built), where requests may go (`backends.addresses.Addresses`: the cluster
IP, or the ready endpoints), the loop mark every request carries, the bounds its annotations set
(`backends/bounds.py`), and its `Endpoints` (`endpoints.py`: balancing, ejection, requests in
flight). `HandlingTable.build` prepares one when an event arrives (the proxy calls it for the
APIService, its Service or an EndpointSlice of that Service, and for every APIService when the
front-proxy client certificate changes); a request never prepares one. The `Endpoints` of an
APIService outlive those rebuilds (an EndpointSlice update must not forget which replica was just
found dead). The identity-header policy is read live per request (`LiveIdentityPolicy`): new
front-proxy header names apply at once, with nothing to rebuild.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from aggregator.backends.addresses import Addresses, PendingLookup, Target
from aggregator.backends.backend import Backend
from aggregator.backends.bounds import DEFAULT_BOUNDS, Bounds, read_bounds
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.backends.registry import BackendRegistry
from aggregator.contracts import EjectionReport
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import AGGREGATOR
from aggregator.proxy.destination import Destination
from aggregator.proxy.endpointmetrics import EndpointMetrics
from aggregator.proxy.endpoints import Endpoint, Endpoints
from aggregator.sources.store import Event, Store
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

# The discovery body an ejected endpoint's probe reads at most (only its status matters).
PROBE_MAX_BODY = 1 << 20
# How long the probe of an ejected endpoint waits for its answer, beyond the connect timeout.
PROBE_TIMEOUT = 5.0
# Bound on the ExternalName destinations kept per APIService (one per address DNS gave).
_MAX_LOOKED_UP = 16


@dataclass(eq=False, slots=True)
class HandlingInfo:
    """One APIService as the proxy serves it (see the module docstring)."""

    apiservice: APIService
    backend: Backend
    addresses: Addresses
    # The ready endpoints (or the cluster IP) as the balancer sees them; None for an ExternalName.
    endpoints: Endpoints | None
    # Why no endpoint may be dialed (every address is denied), when none may.
    denied: BackendError | None
    identity: LiveIdentityPolicy
    hop: str
    # Upstream bounds proxied discovery requests (`/apis/<g>/<v>`) to this many seconds.
    discovery_timeout: float
    bounds: Bounds = DEFAULT_BOUNDS
    # ExternalName: the endpoint for each address a lookup returned (never ejected: one address);
    # None until the first lookup (most APIServices have endpoints and never look one up).
    looked_up: dict[Target, Endpoint] | None = None

    @property
    def name(self) -> str:
        return self.apiservice.name

    @property
    def transport_error(self) -> str | None:
        """Why the TLS settings cannot be built (upstream's transportBuildingError): a 500."""
        backend = self.backend
        if backend.error is not None or backend.context is None:
            return backend.error or "no TLS context"
        return None

    def destination(self, target: Target) -> Destination:
        return Destination(
            self.name,
            self.backend,
            target.ip,
            target.port,
            target.server_name,
            self.identity,
            hop=self.hop,
        )

    def pick(self) -> Endpoint | PendingLookup:
        """Where this request goes first (`Endpoints.choose`; raises BackendError when no address
        can be used); an ExternalName still needs its lookup."""
        endpoints = self.endpoints
        if endpoints is not None and endpoints.all:
            return endpoints.choose()
        addresses = self.addresses
        if addresses.error is not None:
            raise BackendError(addresses.error.hop, addresses.error.cause)
        if addresses.lookup is not None:
            return addresses.lookup
        denied = self.denied
        assert denied is not None, "addresses without an endpoint carry why"
        raise BackendError(denied.hop, denied.cause)

    def looked_up_endpoint(self, target: Target) -> Endpoint:
        """The endpoint of an ExternalName's address, built once per address."""
        looked_up = self.looked_up
        if looked_up is None:
            looked_up = self.looked_up = {}
        endpoint = looked_up.get(target)
        if endpoint is None:
            if len(looked_up) >= _MAX_LOOKED_UP:
                looked_up.clear()
            endpoint = looked_up[target] = Endpoint(self.destination(target))
        return endpoint


class HandlingTable:
    """Builds the `HandlingInfo` of remote APIServices, and keeps their `Endpoints` across builds."""

    def __init__(
        self,
        store: Store,
        backends: BackendRegistry,
        *,
        metrics: EndpointMetrics | None = None,
        report: EjectionReport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.backends = backends
        self.metrics = metrics
        self.report = report
        self.rng = rng or random.Random()
        self._endpoints: dict[str, Endpoints] = {}
        # The annotations last warned about, per APIService.
        self._warned: dict[str, tuple[tuple[str, str], ...]] = {}
        # The probes of ejected endpoints.
        self.tasks = TaskSet("endpoint-probes")
        if metrics is not None:
            metrics.counts.add_source(lambda: ((name, e.all) for name, e in self._endpoints.items()))

    def endpoints(self, name: str) -> Endpoints | None:
        """The APIService's endpoints as the balancer last saw them (ejections and all)."""
        return self._endpoints.get(name)

    def build(self, svc: APIService) -> HandlingInfo | None:
        """The APIService as the proxy serves it now; None for a local one (no `spec.service`)."""
        name = svc.name
        if svc.service is None:
            self.forget(name)
            return None
        backends = self.backends
        addresses = backends.resolver.addresses(svc)
        bounds = read_bounds(svc.annotations)
        if bounds.problems and self._warned.get(name) != svc.annotations:
            self._warned[name] = svc.annotations  # once per change of the annotations, not per rebuild
            log.warning(
                "APIService annotations ignored",
                extra=fields(apiservice=name, problems="; ".join(bounds.problems)),
            )
        info = HandlingInfo(
            apiservice=svc,
            backend=backends.backend_for(svc),
            addresses=addresses,
            endpoints=None,
            denied=None,
            identity=backends.identity,
            hop=backends.hop,
            discovery_timeout=backends.discovery_timeout,
            bounds=bounds,
        )
        destinations: dict[str, Destination] = {}
        for group in addresses.groups:
            for choice in group:
                if isinstance(choice, BackendError):
                    info.denied = info.denied or choice
                else:
                    dest = info.destination(choice)
                    destinations.setdefault(dest.authority, dest)
        if addresses.lookup is None and addresses.error is None:
            endpoints = self._endpoints.get(name)
            if endpoints is None:
                endpoints = self._endpoints[name] = Endpoints(
                    name,
                    rng=self.rng,
                    prober=self._probe,
                    listener=self._ejection,
                )
            for endpoint in endpoints.update(tuple(destinations.values()), bounds):
                self._gone(name, endpoint)
            info.endpoints = endpoints
        return info

    def _ejection(self, name: str, endpoint: Endpoint, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.ejection(name, endpoint, reason)
        if self.report is not None:
            self.report.ejection(name, endpoint.authority, reason)

    def forget(self, name: str) -> None:
        """The APIService is gone (or local): its endpoints' state and series go too."""
        self._warned.pop(name, None)
        endpoints = self._endpoints.pop(name, None)
        if endpoints is not None:
            for endpoint in endpoints.all:
                self._gone(name, endpoint)

    def _gone(self, name: str, endpoint: Endpoint) -> None:
        """The endpoint left the Service: its series go, and it is no longer reported ejected."""
        if self.metrics is not None:
            self.metrics.forget(name, endpoint.authority)
        if self.report is not None and endpoint.ejected_until is not None:
            self.report.ejection(name, endpoint.authority, "")

    def _probe(self, endpoints: Endpoints, endpoint: Endpoint) -> None:
        self.tasks.spawn(self._run_probe(endpoints, endpoint), name=f"{endpoints.name}/{endpoint.authority}")

    async def _run_probe(self, endpoints: Endpoints, endpoint: Endpoint) -> None:
        """GET the group-version's discovery from the ejected endpoint, as availability would: any
        answer but a 5xx brings it back."""
        failure: str | None = None
        svc = self.store.apiservice(endpoints.name)
        dest = endpoint.destination
        try:
            if svc is None:
                raise BackendError(Hop.SERVICE, "the APIService is gone")
            path = f"/apis/{svc.group}/{svc.version}"
            target = Target(dest.host, dest.port, dest.server_name or dest.host)
            async with asyncio.timeout(endpoints.bounds.connect_timeout + PROBE_TIMEOUT):
                response = await self.backends.get_from(
                    svc, target, path, headers={}, user=AGGREGATOR, max_body=PROBE_MAX_BODY
                )
            if response.status >= 500:
                failure = f"probe answered {response.status}"
        except BackendError as err:
            failure = err.cause
        except TimeoutError:
            failure = "probe: no answer in time"
        endpoints.probed(endpoint, failure)

    def affected(self, event: Event) -> list[APIService]:
        """The APIServices a change of a Service or an EndpointSlice touches."""
        return self.store.affected_by(event)

    async def start(self) -> None:
        """`contracts.Component`: nothing runs until an endpoint is ejected."""

    async def stop(self) -> None:
        await self.tasks.close()
