"""TLS contexts and connection pools per backend, and `fetch` for the gateway's own backend calls.

Each remote APIService gets one `Backend`: an SSLContext trusting `spec.caBundle` (system roots
when empty) and presenting the front-proxy client certificate, plus an aiohttp session whose
pool is keyed by the pinned IP. The certificate must be valid for `<service>.<namespace>.svc`
whatever address is dialed (`server_hostname`). A Backend is rebuilt when its APIService's TLS
settings change or the client certificate files do; the old one closes its idle connections at
once and the rest when the last request using it ends (watches are not cut).

Client settings follow the measured pitfalls of an aiohttp proxy: no auto-decompression, no
invented headers, no cookie jar (a shared jar would replay one user's cookies for another), no
redirects, no proxy from the environment, no global connection limit (watches would starve
everything else), 5 s to connect.

`Backends.fetch` is the contract the discovery fetcher and the availability checker use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from aggregator.config import Options
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo
from aggregator.proxy import tlsdiag
from aggregator.proxy.errors import BackendError, Hop, classify
from aggregator.proxy.h1 import H1Pool
from aggregator.proxy.headers import IdentityHeaderPolicy, LiveIdentityPolicy, request_headers
from aggregator.proxy.resolver import Lookup, Resolver, system_lookup
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.tls.pem import CertKeyPair, PEMError, load_pair_into, parse_certificates, read_pair
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields
from aggregator.web.metrics import Metrics

__all__ = ["Backend", "BackendError", "BackendResponse", "Backends", "Hop", "ProxyClientCertificate"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
KEEPALIVE_TIMEOUT = 30.0
DEFAULT_LIMIT_PER_HOST = 512
# Headers aiohttp would invent; a proxy passes the client's own (or none).
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
SESSION_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
# Upstream bounds proxied discovery requests (`/apis/<g>/<v>`) to 5 s; nothing else has a total limit.
DISCOVERY_TIMEOUT = aiohttp.ClientTimeout(total=5.0, sock_connect=CONNECT_TIMEOUT)
INVALID_CA = "unable to load root certificates: unable to parse bytes as PEM block"
# A backend that refused the client certificate is asked why at most this often per address.
ALERT_TTL = 5.0


@dataclass(frozen=True, slots=True)
class BackendResponse:
    """A complete (small) backend answer: status, case-insensitive headers, body bytes."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """Everything a backend's SSLContext is built from; equal settings share a context."""

    ca_bundle: bytes
    insecure: bool
    server_name: str
    cert_generation: int


def client_context(
    ca_pem: bytes | None, *, insecure: bool, client_pair: CertKeyPair | None, verify: bool = True
) -> ssl.SSLContext:
    """A TLS >= 1.2, HTTP/1.1 client context; `ca_pem` None or empty means the system roots.

    Raises PEMError with upstream's message when the CA bundle holds no certificate.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    if insecure or not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_pem:
        try:
            parse_certificates(ca_pem, source="caBundle")
            ctx.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
        except (PEMError, ssl.SSLError) as err:
            raise PEMError(INVALID_CA) from err
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if client_pair is not None:
        load_pair_into(ctx, client_pair)
    return ctx


class Backend:
    """One backend's TLS context and connection pool (an APIService, or kube-apiserver)."""

    def __init__(
        self,
        name: str,
        *,
        context: ssl.SSLContext | None,
        error: str | None = None,
        client_pair: CertKeyPair | None = None,
        limit_per_host: int = DEFAULT_LIMIT_PER_HOST,
    ) -> None:
        self.name = name
        self.context = context
        # Why the context could not be built (upstream's transportBuildingError): requests get a 500.
        self.error = error
        self._client_pair = client_pair
        self._limit_per_host = limit_per_host
        self._session: aiohttp.ClientSession | None = None
        self._pool: H1Pool | None = None
        self._diag_context: ssl.SSLContext | None = None
        # (host, port, server name) -> (expiry, the look in progress or done): see `diagnose`.
        self._alerts: dict[tuple[str, int, str], tuple[float, asyncio.Future[str | None]]] = {}
        self.in_flight = 0
        self.retired = False
        self._closing: asyncio.Task[None] | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Created on first use (it needs the running loop)."""
        session = self._session
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self._limit_per_host,
                keepalive_timeout=KEEPALIVE_TIMEOUT,
                use_dns_cache=False,
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=SKIP_AUTO_HEADERS,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=SESSION_TIMEOUT,
                trust_env=False,
                requote_redirect_url=False,
                max_line_size=65536,
                max_field_size=65536,
            )
        return session

    @property
    def pool(self) -> H1Pool:
        """Keep-alive connections for proxied requests (the lean client)."""
        pool = self._pool
        if pool is None:
            pool = self._pool = H1Pool(
                self.context, limit_per_host=self._limit_per_host, keepalive=KEEPALIVE_TIMEOUT
            )
        return pool

    def acquire(self) -> None:
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self._schedule_close()

    def retire(self) -> None:
        """No new requests; close idle connections now and the rest when the last request ends."""
        self.retired = True
        if self.in_flight == 0:
            self._schedule_close()

    def _schedule_close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._session is None or self._closing is not None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing was ever opened
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def explain_tls(self, host: str, port: int, server_name: str, err: BaseException) -> str:
        """Go's wording for a failed verification, after an unverified look at the certificate."""
        cert_err = getattr(err, "certificate_error", err)
        code = int(getattr(cert_err, "verify_code", 0) or 0)
        message = str(getattr(cert_err, "verify_message", "") or cert_err)
        if self._diag_context is None:
            self._diag_context = client_context(None, insecure=True, client_pair=self._client_pair)
        cert = await tlsdiag.peer_certificate(host, port, server_name, self._diag_context)
        return tlsdiag.explain(cert, server_name, code, message)

    async def diagnose(self, hop: Hop, cause: str, host: str, port: int, server_name: str) -> tuple[Hop, str]:
        """Name the TLS alert behind a bare "EOF" or reset, as Go does; other failures pass as they are.

        With TLS 1.3 a backend that refuses the client certificate (wrong front-proxy CA) says so
        after the handshake, and all the client library sees is a closed connection. Only called
        after a failure; one look per address every ALERT_TTL seconds, shared by the failures
        that arrive meanwhile, so a broken backend under load gets one extra connection, not one
        per request.
        """
        if hop is not Hop.CONNECT or not (cause == "EOF" or cause.endswith("reset by peer")):
            return hop, cause
        context = self.context
        if context is None:
            return hop, cause
        loop = asyncio.get_running_loop()
        key = (host, port, server_name)
        entry = self._alerts.get(key)
        if entry is None or entry[0] <= loop.time():
            if len(self._alerts) > 256:
                self._alerts.clear()
            look = asyncio.ensure_future(tlsdiag.alert_after_handshake(host, port, server_name, context))
            entry = self._alerts[key] = (loop.time() + ALERT_TTL, look)
        alert = await asyncio.shield(entry[1])
        return (Hop.TLS, alert) if alert is not None else (hop, cause)


class ProxyClientCertificate:
    """`--proxy-client-cert-file`/`--proxy-client-key-file`, re-read when the files change.

    A half-written or mismatched pair is refused and the previous one stays in use.
    """

    def __init__(self, cert_file: str | None, key_file: str | None, *, interval: float = 1.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.pair: CertKeyPair | None = read_pair(cert_file, key_file) if cert_file and key_file else None
        self.generation = 0
        self._listeners: list[Callable[[], None]] = []
        self._watcher: PollingWatcher | None = None
        if cert_file and key_file:
            self._watcher = PollingWatcher(
                lambda: stat_fingerprint([cert_file, key_file]),
                self.reload,
                interval=interval,
                name="proxy-client-cert-reload",
            )

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def reload(self) -> None:
        if not (self.cert_file and self.key_file):
            return
        try:
            pair = read_pair(self.cert_file, self.key_file)
        except PEMError as err:
            log.warning(
                "proxy client certificate not reloaded, still presenting the previous one",
                extra=fields(cert_file=self.cert_file, reason=str(err)),
            )
            return
        if (
            self.pair is not None
            and pair.cert_pem == self.pair.cert_pem
            and pair.key_pem == self.pair.key_pem
        ):
            return
        self.pair = pair
        self.generation += 1
        log.info(
            "proxy client certificate reloaded",
            extra=fields(
                cert_file=self.cert_file,
                subject=pair.leaf.subject.rfc4514_string(),
                not_after=pair.leaf.not_valid_after_utc.isoformat(),
            ),
        )
        for listener in self._listeners:
            listener()

    async def start(self) -> None:
        if self._watcher is not None:
            self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()


class Backends:
    """`gateway.backends`: per-APIService transports, the resolver, and `fetch`."""

    def __init__(
        self,
        options: Options,
        store: Store,
        metrics: Metrics,
        *,
        lookup: Lookup = system_lookup,
        reload_interval: float = 1.0,
        limit_per_host: int = DEFAULT_LIMIT_PER_HOST,
    ) -> None:
        self.options = options
        self.store = store
        self.metrics = metrics
        self.limit_per_host = limit_per_host
        self.discovery_timeout = DISCOVERY_TIMEOUT
        self.resolver = Resolver(
            store,
            endpoint_routing=options.enable_aggregator_routing,
            allow_external_name=options.allow_external_name_services,
            deny_cidrs=options.backend_deny_cidrs,
            lookup=lookup,
        )
        # Which inbound headers carry identity; `install_proxy` makes it follow the authenticator's
        # front-proxy configuration (kube mode: the cluster's ConfigMap) as well as the flags.
        self.identity = LiveIdentityPolicy(
            username_headers=options.requestheader_username_headers,
            uid_headers=options.requestheader_uid_headers,
            group_headers=options.requestheader_group_headers,
            extra_prefixes=options.requestheader_extra_headers_prefix,
        )
        self.client_certificate = ProxyClientCertificate(
            options.proxy_client_cert_file, options.proxy_client_key_file, interval=reload_interval
        )
        self.client_certificate.add_listener(self.retire_all)
        self._backends: dict[str, tuple[APIService, TLSSettings, Backend]] = {}
        self._retired: list[Backend] = []
        self._warned_insecure: set[str] = set()
        store.add_listener(self._on_event)

    @property
    def policy(self) -> IdentityHeaderPolicy:
        """The identity-header policy in force now (cheap: see `LiveIdentityPolicy.current`)."""
        return self.identity.current()

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.client_certificate.start()

    async def stop(self) -> None:
        await self.client_certificate.stop()
        backends = [entry[2] for entry in self._backends.values()] + self._retired
        self._backends.clear()
        self._retired.clear()
        await asyncio.gather(*(b.close() for b in backends), return_exceptions=True)

    # --- backends ----------------------------------------------------------------------------------

    def settings_for(self, apiservice: APIService) -> TLSSettings:
        assert apiservice.service is not None
        return TLSSettings(
            apiservice.ca_bundle,
            apiservice.insecure_skip_tls_verify,
            apiservice.service.server_name,
            self.client_certificate.generation,
        )

    def backend_for(self, apiservice: APIService) -> Backend:
        """The cached Backend for a remote APIService, rebuilt when its TLS settings changed."""
        entry = self._backends.get(apiservice.name)
        if entry is not None:
            if entry[0] is apiservice and entry[1].cert_generation == self.client_certificate.generation:
                return entry[2]
            settings = self.settings_for(apiservice)
            if settings == entry[1] and not entry[2].retired:
                self._backends[apiservice.name] = (apiservice, settings, entry[2])
                return entry[2]
            self._retire(entry[2])
        settings = self.settings_for(apiservice)
        backend = self._build(apiservice, settings)
        self._backends[apiservice.name] = (apiservice, settings, backend)
        return backend

    def _build(self, apiservice: APIService, settings: TLSSettings) -> Backend:
        pair = self.client_certificate.pair
        if settings.insecure:
            self.metrics.insecure_backends.labels(apiservice.name).set(1)
            if apiservice.name not in self._warned_insecure:
                self._warned_insecure.add(apiservice.name)
                log.warning(
                    "APIService sets insecureSkipTLSVerify: its backend's certificate is not verified",
                    extra=fields(apiservice=apiservice.name),
                )
        else:
            self._forget_insecure(apiservice.name)
        try:
            context = client_context(settings.ca_bundle, insecure=settings.insecure, client_pair=pair)
        except (PEMError, ssl.SSLError) as err:
            log.error(
                "cannot build the TLS settings for an APIService",
                extra=fields(apiservice=apiservice.name, reason=str(err)),
            )
            return Backend(apiservice.name, context=None, error=str(err))
        return Backend(apiservice.name, context=context, client_pair=pair, limit_per_host=self.limit_per_host)

    def _forget_insecure(self, name: str) -> None:
        if name in self._warned_insecure:
            self._warned_insecure.discard(name)
            with contextlib.suppress(KeyError):
                self.metrics.insecure_backends.remove(name)

    def _retire(self, backend: Backend) -> None:
        backend.retire()
        self._retired = [
            b for b in self._retired if b.in_flight or (b._session is not None and not b._session.closed)
        ]
        if backend.in_flight:
            self._retired.append(backend)

    def retire_all(self) -> None:
        """The client certificate changed: every backend gets a new context on its next request."""
        for _svc, _settings, backend in self._backends.values():
            self._retire(backend)
        self._backends.clear()

    def _on_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE:
            return
        name = event.obj.name
        entry = self._backends.get(name)
        if event.type == DELETED:
            self._forget_insecure(name)
            if entry is not None:
                del self._backends[name]
                self._retire(entry[2])
            return
        obj = event.obj
        if entry is None or not isinstance(obj, APIService):
            return
        if obj.service is None or self.settings_for(obj) != entry[1]:
            del self._backends[name]
            self._retire(entry[2])
            if obj.service is None or not obj.insecure_skip_tls_verify:
                self._forget_insecure(name)

    # --- the fetch contract ------------------------------------------------------------------------

    async def fetch(
        self,
        apiservice: APIService,
        path: str,
        *,
        headers: Mapping[str, str],
        user: UserInfo,
        timeout: float,  # noqa: ASYNC109 - the agreed contract; applied with asyncio.timeout below
    ) -> BackendResponse:
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
            backend = self.backend_for(apiservice)
            if backend.error is not None or backend.context is None:
                raise BackendError(Hop.TRANSPORT, backend.error or "no TLS context")
            async with asyncio.timeout(timeout):
                target = await self.resolver.resolve(apiservice)
                url = target.base_url + path
                out = request_headers(headers.items(), user, self.policy, authority=target.authority)
                backend.acquire()
                try:
                    async with backend.session.get(
                        URL(url, encoded=True),
                        headers=out,
                        ssl=backend.context,
                        server_hostname=target.server_name,
                        allow_redirects=False,
                    ) as resp:
                        body = await resp.read()
                        return BackendResponse(resp.status, resp.headers, body)
                except aiohttp.ClientConnectorCertificateError as err:
                    cause = await backend.explain_tls(target.ip, target.port, target.server_name, err)
                    raise BackendError(Hop.TLS, cause, url=url) from err
                except (aiohttp.ClientError, OSError, ssl.SSLError) as err:
                    hop, cause = await backend.diagnose(
                        *classify(err, target.authority), target.ip, target.port, target.server_name
                    )
                    raise BackendError(hop, cause, url=url) from err
                finally:
                    backend.release()
        except TimeoutError as err:
            failure = BackendError(Hop.TIMEOUT, "context deadline exceeded", url=url)
            self.metrics.backend_errors.labels(apiservice.name, failure.hop.value).inc()
            raise failure from err
        except BackendError as err:
            self.metrics.backend_errors.labels(apiservice.name, err.hop.value).inc()
            raise
