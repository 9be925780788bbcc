"""Which address a request for an APIService is sent to (kube-aggregator's `resolvers.go`, `ResolveCluster` and `ResolveEndpoint`).

By default the Service's cluster IP and the Service port whose `port` equals `spec.service.port`
(`ResolveCluster`); with `--enable-aggregator-routing` a ready endpoint of the Service's
EndpointSlices, port matched by name, from a random start (`ResolveEndpoint`). The objects come
from the store, so local mode resolves through the folder's Service and EndpointSlice manifests
the same way.

Security (CVE-2020-8562, CVE-2021-25740): an ExternalName Service is refused unless
`--allow-external-name-services`; its name is resolved once and the resulting IP is dialed (no
second lookup a DNS server could answer differently); every address is checked against
`--backend-deny-cidrs` before anything is dialed. An unspecified address (`0.0.0.0/8`, `::` and
their IPv4-mapped forms) is refused whatever that flag says: connecting to it reaches the
gateway's own host (Linux routes `0.0.0.0` to the loopback interface), so it would slip past a
deny list naming only `127.0.0.0/8` and `::1`. The TLS verification name is always
`<service>.<namespace>.svc`, whatever address is dialed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aggregator.backends.errors import BackendError, Hop
from aggregator.model.apiservice import APIService, ServiceReference
from aggregator.model.objects import EndpointSlice, Service
from aggregator.sources.store import Store
from aggregator.util.hostport import join_host_port

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Lookup = Callable[[str], Awaitable[list[str]]]

_ROUTABLE_TYPES = ("ClusterIP", "LoadBalancer", "NodePort")
# Never dialed, whatever --backend-deny-cidrs says. RFC 6890 marks all of 0.0.0.0/8 as "this host
# on this network", never a destination; `::` is IPv6's unspecified address. IPv4-mapped forms
# (`::ffff:0.0.0.0`) are matched through `DenyList.match`.
UNSPECIFIED = ("0.0.0.0/8", "::/128")


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved backend: the IP to dial, its port, and the name its certificate must hold."""

    ip: str
    port: int
    server_name: str

    @property
    def authority(self) -> str:
        return join_host_port(self.ip, self.port)

    @property
    def base_url(self) -> str:
        return f"https://{self.authority}"


@dataclass(frozen=True, slots=True)
class PendingLookup:
    """An ExternalName target whose host name still has to be resolved (once) to an IP."""

    host: str
    port: int
    server_name: str
    service: str


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where requests for one APIService may go, worked out once per change of the APIService, its
    Service or its endpoints (`AddressResolver.addresses`): `pick` is all a request does, plus the
    one DNS lookup of an ExternalName.

    `groups` are the candidate targets: one group holding the cluster IP's target, or (endpoint
    routing) one group per EndpointSlice of the preferred address family that has a ready
    endpoint; an entry is the BackendError a denied address gets when it is picked.
    """

    groups: tuple[tuple[Target | BackendError, ...], ...] = ()
    lookup: PendingLookup | None = None
    error: BackendError | None = None

    def pick(self, rng: random.Random) -> Target | PendingLookup:
        """A target: a random slice, then a random ready endpoint in it (`ResolveEndpoint`)."""
        error = self.error
        if error is not None:
            raise BackendError(error.hop, error.cause)
        if self.lookup is not None:
            return self.lookup
        groups = self.groups
        group = groups[0] if len(groups) == 1 else rng.choice(groups)
        entry = group[0] if len(group) == 1 else rng.choice(group)
        if isinstance(entry, BackendError):
            raise BackendError(entry.hop, entry.cause)
        return entry

    def spread(self, rng: random.Random) -> list[Target]:
        """Every distinct dialable target in random order (the availability check's attempts go
        to different endpoints); fewer than two: the list is what `pick` would choose from."""
        seen: dict[str, Target] = {}
        for group in self.groups:
            for entry in group:
                if isinstance(entry, Target):
                    seen.setdefault(entry.authority, entry)
        targets = list(seen.values())
        rng.shuffle(targets)
        return targets


async def system_lookup(host: str) -> list[str]:
    """The host's addresses from the system resolver, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def is_ip(text: str) -> bool:
    """An IPv4 or IPv6 address (not a host name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# Caches keyed by Services or addresses are bounded by what the store holds; the limit only drops
# keys of deleted objects now and then. It is far above any cluster's count (5000 APIServices is a
# large one): a limit below it would empty the cache on every pass over them.
CACHE_LIMIT = 1 << 16


def _family(address: str) -> str:
    return "IPv6" if ":" in address else "IPv4"


class DenyList:
    """The unspecified addresses and `--backend-deny-cidrs`, with verdicts cached per address (the
    same few IPs repeat)."""

    def __init__(self, cidrs: Sequence[str]) -> None:
        self.unspecified: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(c) for c in UNSPECIFIED)
        self.networks: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
        self._verdicts: dict[str, str | None] = {}

    def match(self, address: str) -> str | None:
        """Why `address` is never dialed (`is in --backend-deny-cidrs range 169.254.0.0/16`), or
        None when it may be."""
        try:
            return self._verdicts[address]
        except KeyError:
            pass
        ip = ipaddress.ip_address(address)
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None

        def first(networks: tuple[IPNetwork, ...]) -> IPNetwork | None:
            return next((n for n in networks if ip in n or (mapped is not None and mapped in n)), None)

        verdict: str | None = None
        unspecified = first(self.unspecified)
        if unspecified is not None:
            verdict = f"unspecified ({unspecified}): dialing it reaches the gateway's own host, so it is never dialed"
        else:
            network = first(self.networks)
            if network is not None:
                verdict = f"in --backend-deny-cidrs range {network}"
        if len(self._verdicts) > CACHE_LIMIT:
            self._verdicts.clear()
        self._verdicts[address] = verdict
        return verdict


class AddressResolver:
    def __init__(
        self,
        store: Store,
        *,
        endpoint_routing: bool = False,
        allow_external_name: bool = False,
        deny_cidrs: Sequence[str] = (),
        lookup: Lookup = system_lookup,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.endpoint_routing = endpoint_routing
        self.allow_external_name = allow_external_name
        self.deny = DenyList(deny_cidrs)
        self.lookup = lookup
        self.rng = rng or random.Random()
        # (namespace, name, port) -> the Service object it was worked out from, and its Addresses.
        self._cluster_cache: dict[tuple[str, str, int], tuple[Service, Addresses]] = {}

    # --- public ------------------------------------------------------------------------------------

    async def resolve(self, apiservice: APIService) -> Target:
        """The target for a remote APIService, or BackendError naming the failing hop."""
        found = self.resolve_now(apiservice)
        if isinstance(found, PendingLookup):
            return await self.finish_lookup(found)
        return found

    def resolve_now(self, apiservice: APIService) -> Target | PendingLookup:
        """Everything that needs no DNS; an ExternalName comes back as a PendingLookup."""
        return self.addresses(apiservice).pick(self.rng)

    def addresses(self, apiservice: APIService) -> Addresses:
        """Where requests for a remote APIService may go now (a BackendError inside names the
        failing hop): upstream's `ResolveCluster`, or `ResolveEndpoint` with endpoint routing."""
        ref = apiservice.service
        try:
            if ref is None:
                raise BackendError(Hop.SERVICE, f"APIService {apiservice.name} is local (no spec.service)")
            if self.endpoint_routing:
                return self._endpoint_addresses(ref)
        except BackendError as err:
            return Addresses(error=err)
        return self._cluster_addresses(ref)

    def _cluster_addresses(self, ref: ServiceReference) -> Addresses:
        """`ResolveCluster`, worked out once per Service object: the availability checker and the
        fetchers resolve every backend on every pass, and at thousands of them the work adds up."""
        key = (ref.namespace, ref.name, ref.port)
        svc = self.store.service(ref.namespace, ref.name)
        cached = self._cluster_cache.get(key)
        if cached is not None and svc is cached[0]:
            return cached[1]
        try:
            found = self._resolve_cluster(ref, svc)
            if isinstance(found, PendingLookup):
                addresses = Addresses(lookup=found)
            else:
                addresses = Addresses(((self._checked(found, ref),),))
        except BackendError as err:
            addresses = Addresses(error=err)
        if svc is not None:
            if len(self._cluster_cache) > CACHE_LIMIT:
                self._cluster_cache.clear()
            self._cluster_cache[key] = (svc, addresses)
        return addresses

    async def finish_lookup(self, pending: PendingLookup) -> Target:
        """Resolve an ExternalName once and pin the first address the deny list allows."""
        if is_ip(pending.host):
            addresses = [pending.host]
        else:
            try:
                addresses = await self.lookup(pending.host)
            except OSError as err:
                raise BackendError(
                    Hop.CONNECT, f"dial tcp: lookup {pending.host}: {err.strerror or 'no such host'}"
                ) from err
        if not addresses:
            raise BackendError(Hop.CONNECT, f"dial tcp: lookup {pending.host}: no such host")
        for address in addresses:
            if self.deny.match(address) is None:
                return Target(address, pending.port, pending.server_name)
        raise BackendError(
            Hop.DENY_CIDR,
            f"address {addresses[0]} of service {pending.service} (ExternalName {pending.host}) is "
            f"{self.deny.match(addresses[0])}",
        )

    # --- upstream's two resolvers -------------------------------------------------------------------

    def _service(self, ref: ServiceReference) -> Service:
        svc = self.store.service(ref.namespace, ref.name)
        if svc is None:
            raise BackendError(Hop.SERVICE, f'service "{ref.name}" not found')
        return svc

    def _resolve_cluster(self, ref: ServiceReference, svc: Service | None) -> Target | PendingLookup:
        """`ResolveCluster`: cluster IP and the Service port equal to spec.service.port."""
        if svc is None:
            raise BackendError(Hop.SERVICE, f'service "{ref.name}" not found')
        if svc.type == "ClusterIP" and svc.cluster_ip == "None":
            raise BackendError(Hop.SERVICE, 'cannot route to service with ClusterIP "None"')
        if svc.type in _ROUTABLE_TYPES:
            port = svc.port_by_number(ref.port)
            if port is None:
                raise BackendError(Hop.PORT, f'no service port {ref.port} found for service "{svc.name}"')
            if not svc.cluster_ip:
                raise BackendError(Hop.SERVICE, f'service "{svc.name}" has no cluster IP')
            if not is_ip(svc.cluster_ip):
                raise BackendError(
                    Hop.SERVICE, f'service "{svc.name}" has cluster IP {svc.cluster_ip!r}, not an IP address'
                )
            return Target(svc.cluster_ip, port.port, ref.server_name)
        if svc.type == "ExternalName":
            if not self.allow_external_name:
                raise BackendError(
                    Hop.SERVICE,
                    f'service "{svc.name}" is of type ExternalName, which is refused unless '
                    "--allow-external-name-services is set",
                )
            if not svc.external_name:
                raise BackendError(Hop.SERVICE, f'service "{svc.name}" has no externalName')
            return PendingLookup(
                svc.external_name.rstrip("."), ref.port, ref.server_name, f"{ref.namespace}/{ref.name}"
            )
        raise BackendError(Hop.SERVICE, f'unsupported service type "{svc.type}"')

    def _endpoint_addresses(self, ref: ServiceReference) -> Addresses:
        """`ResolveEndpoint`: the ready endpoints of the slices whose port name matches the Service
        port's, the Service's own IP family first (upstream uses spec.ipFamilies[0])."""
        svc = self._service(ref)
        if svc.type not in _ROUTABLE_TYPES:
            raise BackendError(Hop.SERVICE, f'unsupported service type "{svc.type}"')
        port = svc.port_by_number(ref.port)
        if port is None:
            raise BackendError(Hop.PORT, f'no service port {ref.port} found for service "{svc.name}"')
        slices = self.store.endpointslices_for(svc.namespace, svc.name)
        if not slices:
            raise BackendError(Hop.ENDPOINTS, f'no endpoints available for service "{svc.name}"')
        preferred = _family(svc.cluster_ip) if is_ip(svc.cluster_ip) else "IPv4"
        for tier in (
            [s for s in slices if s.address_type == preferred],
            [s for s in slices if s.address_type != preferred],
        ):
            groups = tuple(group for s in tier if (group := self._endpoints_in(s, port.name, ref)))
            if groups:
                return Addresses(groups)
        raise BackendError(Hop.ENDPOINTS, f'no endpoints available for service "{svc.name}"')

    def _endpoints_in(
        self, eps: EndpointSlice, port_name: str, ref: ServiceReference
    ) -> tuple[Target | BackendError, ...]:
        """The slice's ready endpoints on the named port (a denied one as its error)."""
        for slice_port in eps.ports:
            if (slice_port.name or "") != port_name or slice_port.port is None or not eps.endpoints:
                continue
            found: list[Target | BackendError] = []
            for endpoint in eps.endpoints:
                # Only addresses[0] is used (as upstream); FQDN slices cannot be pinned to an IP.
                if endpoint.ready is not False and endpoint.addresses and is_ip(endpoint.addresses[0]):
                    target = Target(endpoint.addresses[0], slice_port.port, ref.server_name)
                    try:
                        found.append(self._checked(target, ref))
                    except BackendError as err:
                        found.append(err)
            if found:
                return tuple(found)
        return ()

    def _checked(self, target: Target, ref: ServiceReference) -> Target:
        denied = self.deny.match(target.ip)
        if denied is not None:
            raise BackendError(
                Hop.DENY_CIDR, f"address {target.ip} of service {ref.namespace}/{ref.name} is {denied}"
            )
        return target
