"""What the proxy knows about each APIService it serves, prepared ahead of the requests.

kube-aggregator keeps one `proxyHandlingInfo` per APIService (handler_proxy.go), rebuilt by
`updateAPIService` when the APIService changes, so that `ServeHTTP` only reads it. `HandlingInfo`
is the gateway's: the APIService, the backend (its TLS context and connection pool, or why the
TLS settings cannot be built), where requests may go (`backends.addresses.Addresses`: the cluster
IP, or the ready endpoints), the destinations built from those, and the identity-header policy
and loop mark every request carries. `HandlingTable` keeps them by name: a store event for the
APIService, its Service or an EndpointSlice of that Service drops the entry, and the next request
prepares it again; a rotated front-proxy client certificate or new front-proxy header names are
noticed by two identity checks. A request does one lookup and reads, never derives.

The shape is meant to grow: the per-APIService resilience settings (endpoint balancing, outlier
ejection, retries, timeouts and concurrency limits from annotations) belong on `HandlingInfo`,
beside the addresses they act on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.backends.addresses import Addresses, PendingLookup, Target
from aggregator.backends.backend import Backend
from aggregator.backends.errors import BackendError
from aggregator.backends.headers import IdentityHeaderPolicy
from aggregator.backends.registry import BackendRegistry
from aggregator.model.apiservice import APIService
from aggregator.proxy.destination import Destination
from aggregator.sources.store import Event, Kind, Store

# Entries of a `Choices` group: where to go, or the error a denied address gets.
Choice = Destination | BackendError
# Bound on the ExternalName destinations kept per APIService (one per address DNS gave).
_MAX_LOOKED_UP = 16


@dataclass(eq=False)
class HandlingInfo:
    """One APIService as the proxy serves it (see the module docstring)."""

    apiservice: APIService
    backend: Backend
    addresses: Addresses
    # `addresses.groups` as destinations (same shape); empty for an ExternalName or an error.
    choices: tuple[tuple[Choice, ...], ...]
    policy: IdentityHeaderPolicy
    cert_generation: int
    hop: str
    # Upstream bounds proxied discovery requests (`/apis/<g>/<v>`) to this many seconds.
    discovery_timeout: float
    # ExternalName: the destination for each address a lookup returned.
    looked_up: dict[Target, Destination] = field(default_factory=dict)

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
            self.policy,
            hop=self.hop,
        )

    def pick(self, pick_index: Callable[[int], int]) -> Destination | PendingLookup:
        """Where this request goes: a random choice among the candidates (raises BackendError
        for an address that cannot be used); an ExternalName still needs its lookup."""
        addresses = self.addresses
        if addresses.error is not None:
            raise BackendError(addresses.error.hop, addresses.error.cause)
        if addresses.lookup is not None:
            return addresses.lookup
        choices = self.choices
        group = choices[0] if len(choices) == 1 else choices[pick_index(len(choices))]
        choice = group[0] if len(group) == 1 else group[pick_index(len(group))]
        if isinstance(choice, BackendError):
            raise BackendError(choice.hop, choice.cause)
        return choice

    def looked_up_destination(self, target: Target) -> Destination:
        """The destination of an ExternalName's address, built once per address."""
        dest = self.looked_up.get(target)
        if dest is None:
            if len(self.looked_up) >= _MAX_LOOKED_UP:
                self.looked_up.clear()
            dest = self.looked_up[target] = self.destination(target)
        return dest


class HandlingTable:
    """The `HandlingInfo` of every remote APIService, prepared on first use after a change."""

    def __init__(self, store: Store, backends: BackendRegistry) -> None:
        self.store = store
        self.backends = backends
        self._infos: dict[str, HandlingInfo] = {}

    def get(self, name: str) -> HandlingInfo | None:
        """The APIService's handling info, None when it is gone or local (no `spec.service`)."""
        info = self._infos.get(name)
        if (
            info is not None
            and info.cert_generation == self.backends.client_certificate.generation
            and info.policy is self.backends.policy
        ):
            return info
        return self._prepare(name)

    def _prepare(self, name: str) -> HandlingInfo | None:
        svc = self.store.apiservice(name)
        if svc is None or svc.service is None:
            self._infos.pop(name, None)
            return None
        backends = self.backends
        addresses = backends.resolver.addresses(svc)
        info = HandlingInfo(
            apiservice=svc,
            backend=backends.backend_for(svc),
            addresses=addresses,
            choices=(),
            policy=backends.policy,
            cert_generation=backends.client_certificate.generation,
            hop=backends.hop,
            discovery_timeout=backends.discovery_timeout,
        )
        info.choices = tuple(
            tuple(c if isinstance(c, BackendError) else info.destination(c) for c in group)
            for group in addresses.groups
        )
        self._infos[name] = info
        return info

    def on_store_event(self, event: Event) -> None:
        """Forget what the change may affect: the APIService itself, or the APIServices of a
        Service and of its EndpointSlices."""
        if event.kind is Kind.APISERVICE:
            self._infos.pop(event.obj.name, None)
            return
        for namespace, service in event.services():
            for svc in self.store.apiservices_for_service(namespace, service):
                self._infos.pop(svc.name, None)
