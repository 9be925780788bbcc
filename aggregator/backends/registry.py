"""The backends of the remote APIServices, and the gateway's own GETs to them (`fetch`).

One `Backend` (SSLContext + keep-alive pool) per distinct TLS setting: the caBundle trusted (the
system roots when empty), `insecureSkipTLSVerify` and the front-proxy client certificate
presented. The name the certificate must hold (`<service>.<namespace>.svc`, whatever address is
dialed) is checked per connection, and the pool is keyed by address and name, so APIServices with
the same caBundle share one context, and a server with ten group-versions keeps one set of
connections warm, not ten. A
backend is retired (idle connections closed at once, the rest when their exchange ends: watches
are not cut) when no APIService uses its settings any more or the client certificate changes.

`fetch` is `contracts.BackendFetcher`: the GETs discovery and OpenAPI make as the gateway's own
identity, through the same resolution, deny list, TLS and client as proxied requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping

from aggregator.backends.addresses import AddressResolver, Target
from aggregator.backends.backend import Address, Backend
from aggregator.backends.client_cert import ProxyClientCertificate
from aggregator.backends.errors import BackendError, Hop
from aggregator.backends.h1 import IdleConnections
from aggregator.backends.headers import IdentityHeaderPolicy, LiveIdentityPolicy, forwarded_headers
from aggregator.backends.metrics import BackendMetrics
from aggregator.backends.tls import TLSSettings, client_context
from aggregator.contracts import FetchedResponse
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.tls.pem import PEMError
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

# Upstream bounds proxied discovery requests (`/apis/<g>/<v>`) to 5 s; nothing else has a total limit.
DISCOVERY_TIMEOUT = 5.0
# Enough for any discovery or OpenAPI document the gateway fetches for itself.
MAX_FETCH_BODY = 64 * 1024 * 1024


def address_of(target: Target) -> Address:
    return Address(target.ip, target.port, target.server_name)


class BackendRegistry:
    def __init__(
        self,
        store: Store,
        metrics: BackendMetrics,
        *,
        resolver: AddressResolver,
        client_certificate: ProxyClientCertificate,
        identity: LiveIdentityPolicy,
        hop: str,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.resolver = resolver
        self.client_certificate = client_certificate
        # Which inbound headers carry identity (stripped before anything reaches a backend).
        self.identity = identity
        # This gateway's loop mark, on every request to a backend (`hops.py`).
        self.hop = hop
        self.discovery_timeout = DISCOVERY_TIMEOUT
        self._settings: dict[str, tuple[APIService, TLSSettings]] = {}  # APIService name -> its settings
        self._backends: dict[TLSSettings, Backend] = {}
        self._users: dict[TLSSettings, set[str]] = {}
        self._warned_insecure: set[str] = set()
        # Idle connections to every backend, bounded together: thousands of Services hold at most
        # this many between their requests (the rest close, oldest first).
        self.idle = IdleConnections()
        # Backends read TLS answers through `BufferedReads` (set by the control process: see there).
        self.buffered_reads = False

    @property
    def policy(self) -> IdentityHeaderPolicy:
        """The identity-header policy in force now (cheap: see `LiveIdentityPolicy.current`)."""
        return self.identity.current()

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.client_certificate.start()

    async def stop(self) -> None:
        await self.client_certificate.stop()
        self.retire_all()

    # --- backends ----------------------------------------------------------------------------------

    def settings_for(self, apiservice: APIService) -> TLSSettings:
        assert apiservice.service is not None
        return TLSSettings(
            apiservice.ca_bundle, apiservice.insecure_skip_tls_verify, self.client_certificate.generation
        )

    def backend_for(self, apiservice: APIService) -> Backend:
        """The Backend for a remote APIService's TLS settings (built on first use)."""
        name = apiservice.name
        seen = self._settings.get(name)
        if (
            seen is not None
            and seen[0] is apiservice
            and seen[1].cert_generation == self.client_certificate.generation
        ):
            backend = self._backends.get(seen[1])
            if backend is not None:
                return backend
        settings = self.settings_for(apiservice)
        if seen is not None and seen[1] != settings:
            self._release(name, seen[1])
        self._settings[name] = (apiservice, settings)
        self._users.setdefault(settings, set()).add(name)
        backend = self._backends.get(settings)
        if backend is None:
            backend = self._backends[settings] = self._build(apiservice, settings)
        return backend

    def _build(self, apiservice: APIService, settings: TLSSettings) -> Backend:
        pair = self.client_certificate.pair
        if settings.insecure:
            self.metrics.insecure.labels(apiservice.name).set(1)
            if apiservice.name not in self._warned_insecure:
                self._warned_insecure.add(apiservice.name)
                log.warning(
                    "APIService sets insecureSkipTLSVerify: its backend's certificate is not verified",
                    extra=fields(apiservice=apiservice.name),
                )
        try:
            context = client_context(settings.ca_bundle, insecure=settings.insecure, client_pair=pair)
        except (PEMError, ssl.SSLError) as err:
            log.error(
                "cannot build the TLS settings for an APIService",
                extra=fields(apiservice=apiservice.name, reason=str(err)),
            )
            return Backend(apiservice.name, context=None, error=str(err))
        return Backend(
            apiservice.name, context=context, client_pair=pair, idle=self.idle, buffered_reads=self.buffered_reads
        )

    def _release(self, name: str, settings: TLSSettings) -> None:
        users = self._users.get(settings)
        if users is not None:
            users.discard(name)
            if users:
                return
            del self._users[settings]
        backend = self._backends.pop(settings, None)
        if backend is not None:
            backend.retire()

    def _forget_insecure(self, name: str) -> None:
        if name in self._warned_insecure:
            self._warned_insecure.discard(name)
            with contextlib.suppress(KeyError):
                self.metrics.insecure.remove(name)

    def retire_all(self) -> None:
        """Every backend retired (the client certificate changed, or the registry stops): each gets a
        new context on its next request."""
        for backend in self._backends.values():
            backend.retire()
        self._backends.clear()
        self._users.clear()
        self._settings.clear()

    def on_store_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE:
            return
        name = event.obj.name
        obj = event.obj
        seen = self._settings.get(name)
        if event.type == DELETED or not isinstance(obj, APIService) or obj.service is None:
            self._forget_insecure(name)
            if seen is not None:
                del self._settings[name]
                self._release(name, seen[1])
            return
        if not obj.insecure_skip_tls_verify:
            self._forget_insecure(name)
        if seen is not None and self.settings_for(obj) != seen[1]:
            del self._settings[name]
            self._release(name, seen[1])

    # --- the gateway's own requests ----------------------------------------------------------------

    async def resolve(self, apiservice: APIService) -> Target:
        """The address a request for this APIService goes to; BackendError names the failing hop."""
        return await self.resolver.resolve(apiservice)

    async def get_from(
        self,
        apiservice: APIService,
        target: Target,
        path: str,
        *,
        headers: Mapping[str, str],
        user: UserInfo,
        max_body: int = MAX_FETCH_BODY,
    ) -> FetchedResponse:
        """GET `path` from the resolved `target` as `user`; the whole body. The caller bounds the time."""
        url = target.base_url + path
        backend = self.backend_for(apiservice)
        if backend.error is not None or backend.context is None:
            raise BackendError(Hop.TRANSPORT, backend.error or "no TLS context")
        def head() -> Iterable[tuple[str, str]]:
            return forwarded_headers(headers.items(), user, self.policy, authority=target.authority, hop=self.hop)

        try:
            return await backend.get(address_of(target), path, head, max_body=max_body)
        except BackendError as err:
            failure = err.at(url)
        raise failure

    async def fetch(
        self,
        apiservice: APIService,
        path: str,
        *,
        headers: Mapping[str, str],
        user: UserInfo,
        timeout: float,  # noqa: ASYNC109 - the contract's deadline, applied with asyncio.timeout below
    ) -> FetchedResponse:
        """GET `path` from the APIService's backend as `user`; the whole body, within `timeout` seconds.

        Redirects are not followed: a 3xx comes back as a response for the caller to refuse.
        Raises BackendError (`.hop`, `.cause`, `.url`) when the backend cannot be reached.
        """
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        url = ""
        try:
            if apiservice.service is None:
                raise BackendError(Hop.SERVICE, f"APIService {apiservice.name} is local (no spec.service)")
            async with asyncio.timeout(timeout):
                target = await self.resolve(apiservice)
                url = target.base_url + path
                return await self.get_from(apiservice, target, path, headers=headers, user=user)
        except TimeoutError:
            failure = BackendError(Hop.TIMEOUT, "context deadline exceeded", url=url)
        except BackendError as err:
            failure = err
        self.metrics.errors.labels(apiservice.name, failure.hop.value).inc()
        raise failure
