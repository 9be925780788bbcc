"""The one way the gateway talks to kube-apiserver: credentials from `kubernetes.aio.config`, calls over aiohttp.

The official client's config loader understands every kubeconfig (exec plugins, token files,
client certificates, `tls-server-name`) and the in-cluster service account; its typed API is slow
and its watch gives up on 410, so requests are plain aiohttp on one shared session.

Credentials are re-loaded every `refresh_interval` seconds and right after a 401: an edited
kubeconfig, a rotated token file, a rotated service-account token or client certificate, and an
expired exec-plugin token are all picked up without a restart. Nothing here logs a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, Unpack

import aiohttp
import yarl

from aggregator import __version__
from aggregator.kube.calls import ApiCall, is_declared
from aggregator.util.flags import ConfigError
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

USER_AGENT = f"aggregator/{__version__}"
DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=10)
IN_CLUSTER_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
IN_CLUSTER_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

Params = Mapping[str, str | int | float]


class JSONCallOptions(TypedDict, total=False):
    """What a call names besides its `ApiCall`: the object, the query, a JSON body, a timeout."""

    namespace: str | None
    name: str | None
    params: Params | None
    json_body: Any
    client_timeout: aiohttp.ClientTimeout | None


class CallOptions(JSONCallOptions, total=False):
    """A call's options with a raw body and extra headers (`stream` and `request`)."""

    data: bytes | None
    headers: Mapping[str, str] | None


class KubeError(Exception):
    """A kube-apiserver call that did not succeed."""


class KubeUnreachable(KubeError):
    """No HTTP answer: connection refused, TLS failure, timeout, or a connection dropped mid-response."""


class KubeAPIError(KubeError):
    """kube-apiserver answered with an error status; `body` is its Status object when it sent one."""

    def __init__(self, call: ApiCall, status: int, body: Mapping[str, Any] | None, text: str = "") -> None:
        self.call = call
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", "")) if body else ""
        self.message = str(body.get("message", "")) if body else text[:200]
        super().__init__(f"{call}: HTTP {status}{f' {self.reason}' if self.reason else ''}: {self.message}")


class NotLoaded(RuntimeError):
    """Read a property of a KubeClient before `await client.load()`."""


def _import(module: str) -> Any:
    """The kubernetes package is untyped and slow to import: load it only when a client is used."""
    return importlib.import_module(module)


# The extra that installs the kubernetes package (pyproject.toml): local mode does without it.
KUBE_EXTRA = "aggregator[kube]"


def missing_kube_client() -> str | None:
    """Why no KubeClient can load credentials here (the `kube` extra is not installed), or None.

    Asked at start by whatever will build a client (kube mode, a kubeconfig for reviews), so a
    gateway without the extra stops with one line naming it instead of failing at its first call.
    """
    try:
        _import("kubernetes.aio.config")
    except ImportError as err:
        return (
            f"needs the kubernetes client, which is not installed ({err}): it is the package's kube extra, "
            f"pip install '{KUBE_EXTRA}'"
        )
    return None


# --- where credentials come from -------------------------------------------------------------------


class CredentialSource(Protocol):
    """Fills a fresh `kubernetes.aio.client.Configuration`; called at start and on every refresh."""

    @property
    def description(self) -> str: ...

    async def load(self, cfg: Any) -> None: ...


@dataclass
class KubeconfigCredentials:
    """A kubeconfig file (and optional context). The loader is kept between refreshes so an exec
    plugin's unexpired token is reused; an edited file gets a fresh loader."""

    path: str
    context: str | None = None
    _loader: Any = field(default=None, repr=False)
    _stamp: tuple[int, int, int] | None = field(default=None, repr=False)

    @property
    def description(self) -> str:
        return f"kubeconfig {self.path}" + (f" (context {self.context})" if self.context else "")

    async def load(self, cfg: Any) -> None:
        kconfig = _import("kubernetes.aio.config")
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._loader is None or stamp != self._stamp:
            self._loader = await kconfig.load_kube_config(
                config_file=self.path, context=self.context, client_configuration=cfg, persist_config=False
            )
            self._stamp = stamp
        else:
            # Re-reads tokenFile and client-certificate paths; re-runs an exec plugin only when expired.
            await self._loader.load_and_set(cfg)


@dataclass
class InClusterCredentials:
    """The pod's service account: token and CA re-read from the mounted files on every refresh."""

    token_file: str = IN_CLUSTER_TOKEN_FILE
    ca_file: str = IN_CLUSTER_CA_FILE
    environ: Mapping[str, str] | None = None
    description: str = "in-cluster service account"

    async def load(self, cfg: Any) -> None:
        loader = _import("kubernetes.aio.config.incluster_config").InClusterConfigLoader(
            token_filename=self.token_file,
            cert_filename=self.ca_file,
            environ=os.environ if self.environ is None else self.environ,
        )
        loader.load_and_set(cfg)


# --- how to reach and trust the server ------------------------------------------------------------


@dataclass(frozen=True)
class ServerTrust:
    """kube-apiserver's address and how to verify it, without any user credentials.

    The delegate proxy in front-proxy mode uses this with its own client certificate:
    `ctx = trust.new_context(); load_pair_into(ctx, front_proxy_pair)`, then connect with
    `ssl=ctx, server_hostname=trust.server_name`.
    """

    base_url: str
    ca_pem: bytes | None
    verify: bool = True
    # kubeconfig `tls-server-name`: the name sent in SNI and checked in the certificate.
    server_name: str | None = None

    @property
    def tls(self) -> bool:
        return self.base_url.startswith("https:")

    def new_context(self) -> ssl.SSLContext:
        """Verifying as client-go does: the kubeconfig's CA (or the system roots), and names matched
        against subject alternative names only (Go refuses Common-Name-only certificates since 1.15)."""
        if not self.verify:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        if self.ca_pem:
            ctx = ssl.create_default_context(cadata=self.ca_pem.decode("ascii", "replace"))
        else:
            ctx = ssl.create_default_context()
        ctx.hostname_checks_common_name = False
        return ctx

    def connect_kwargs(self, ctx: ssl.SSLContext) -> dict[str, Any]:
        """`ssl=` and `server_hostname=` for an aiohttp request to this server."""
        if not self.tls:
            return {}
        kwargs: dict[str, Any] = {"ssl": ctx}
        if self.server_name:
            kwargs["server_hostname"] = self.server_name
        return kwargs


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as handle:
        return handle.read()


@dataclass(frozen=True)
class _Loaded:
    cfg: Any
    trust: ServerTrust
    # (CA, client cert, client key) contents: the TLS context is rebuilt only when these change.
    tls_material: tuple[bytes | None, bytes | None, bytes | None]
    proxy: str | None


@dataclass(frozen=True)
class KubeResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _status_body(text: bytes) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


class KubeClient:
    """Credentials, TLS and one aiohttp session for every kube-apiserver call the gateway makes.

    Usable as a gateway component (`start` loads credentials, `stop` closes the session); every
    method that needs the loaded state loads it first, so callers never depend on start order.
    """

    def __init__(
        self,
        credentials: CredentialSource,
        *,
        refresh_interval: float = 60.0,
        max_connections_per_host: int = 100,
        request_timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT,
    ) -> None:
        self.credentials = credentials
        self.refresh_interval = refresh_interval
        self.request_timeout = request_timeout
        self._max_per_host = max_connections_per_host
        self._loaded: _Loaded | None = None
        self._ssl: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._next_refresh = 0.0
        # Bumped whenever the server's CA / address changes, so users of `trust` can rebuild.
        self.trust_generation = 0
        # Told when the TLS settings (server, CA, our client certificate) change after loading.
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None, **kwargs: Any) -> KubeClient:
        return cls(KubeconfigCredentials(path, context), **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubeClient:
        return cls(InClusterCredentials(), **kwargs)

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.load()
        log.info(
            "kube-apiserver client ready",
            extra=fields(server=self.base_url, credentials=self.credentials.description),
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def load(self) -> None:
        """Load credentials once (idempotent); later refreshes happen on their own.

        A kubeconfig or service account that cannot be loaded is a ConfigError naming the source:
        the gateway cannot do anything useful in kube mode without it.
        """
        if self._loaded is None:
            async with self._lock:
                if self._loaded is None:
                    try:
                        await self._reload(initial=True)
                    except Exception as err:
                        flag = (
                            "--kubeconfig"
                            if isinstance(self.credentials, KubeconfigCredentials)
                            else "in-cluster"
                        )
                        raise ConfigError(
                            flag, f"cannot load {self.credentials.description}: {describe_error(err)}"
                        ) from err

    # --- what other components reuse --------------------------------------------------------------

    def _state(self) -> _Loaded:
        if self._loaded is None:
            raise NotLoaded("KubeClient used before `await client.load()`")
        return self._loaded

    @property
    def base_url(self) -> str:
        return self._state().trust.base_url

    @property
    def trust(self) -> ServerTrust:
        """Server address, CA and TLS server name, without user credentials."""
        return self._state().trust

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """Trusts kube-apiserver and presents the kubeconfig's client certificate, if any."""
        self._state()
        assert self._ssl is not None
        return self._ssl

    def connect_kwargs(self) -> dict[str, Any]:
        """`ssl=`/`server_hostname=` (and `proxy=`) for an aiohttp request with the gateway's identity."""
        state = self._state()
        kwargs = state.trust.connect_kwargs(self.ssl_context)
        if state.proxy:
            kwargs["proxy"] = state.proxy
        return kwargs

    async def auth_headers(self) -> dict[str, str]:
        """`Authorization` for the next request (refreshing the token first when due), or {}."""
        await self._refresh_if_due()
        token = await self._state().cfg.get_api_key_with_prefix("BearerToken")
        token = token.strip() if isinstance(token, str) else ""
        return {"Authorization": token} if token else {}

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called whenever a reload changed kube-apiserver's address, CA or our client certificate."""
        self._listeners.append(listener)

    def invalidate_credentials(self) -> None:
        """Reload credentials before the next request (called on every 401)."""
        self._next_refresh = 0.0

    # --- requests ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stream(
        self, call: ApiCall, **options: Unpack[CallOptions]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open a request and yield the response unread (watches read it line by line).

        Connection failures raise KubeUnreachable; errors while reading the body are aiohttp's.
        A 401 makes the next request reload credentials.
        """
        if not is_declared(call):
            raise ValueError(f"undeclared kube-apiserver call {call}: add it to aggregator/kube/calls.py")
        await self.load()
        request_headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        request_headers.update(await self.auth_headers())
        data, json_body, headers = options.get("data"), options.get("json_body"), options.get("headers")
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            request_headers["Content-Type"] = "application/json"
        if headers:
            request_headers.update(headers)
        query: dict[str, str] = {k: str(v) for k, v in (options.get("params") or {}).items()}
        if call.verb == "watch":
            query["watch"] = "true"
        path = call.url_path(namespace=options.get("namespace"), name=options.get("name"))
        url = yarl.URL(self.base_url + path)
        if query:
            url = url.with_query(query)
        session = self._get_session()
        try:
            response = await session.request(
                call.method,
                url,
                data=data,
                headers=request_headers,
                timeout=options.get("client_timeout") or self.request_timeout,
                allow_redirects=False,
                **self.connect_kwargs(),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise KubeUnreachable(f"{call}: {describe_error(err)}") from err
        try:
            if response.status == 401:
                self.invalidate_credentials()
            yield response
        finally:
            response.release()

    async def request(self, call: ApiCall, **options: Unpack[CallOptions]) -> KubeResponse:
        """One call with its whole body read; any status is returned, connection failures raise."""
        async with self.stream(call, **options) as response:
            try:
                body = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                raise KubeUnreachable(f"{call}: {describe_error(err)}") from err
            return KubeResponse(response.status, dict(response.headers), body)

    async def request_json(self, call: ApiCall, **options: Unpack[JSONCallOptions]) -> Any:
        """One call returning the decoded JSON body; a non-2xx answer raises KubeAPIError."""
        response = await self.request(call, **options)
        if not 200 <= response.status < 300:
            raise KubeAPIError(
                call, response.status, _status_body(response.body), response.body.decode("utf-8", "replace")
            )
        try:
            return response.json()
        except ValueError as err:
            raise KubeAPIError(call, response.status, None, f"response is not JSON: {err}") from err

    # --- internals -----------------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # Watches hold a connection each for minutes: no global cap that could starve reviews.
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=self._max_per_host),
                # One watch event is one line; objects can be large (caBundles, many ports).
                read_bufsize=2**21,
                # We set our own User-Agent; kube-apiserver only speaks gzip, not br/zstd.
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                headers={"Accept-Encoding": "gzip"},
            )
        return self._session

    async def _refresh_if_due(self) -> None:
        if time.monotonic() < self._next_refresh:
            return
        async with self._lock:
            if time.monotonic() < self._next_refresh:
                return
            try:
                await self._reload(initial=False)
            except Exception as err:
                # Keep the credentials we have; the next request tries again after the interval.
                self._next_refresh = time.monotonic() + min(self.refresh_interval, 5.0)
                log.warning(
                    "reloading kube-apiserver credentials failed; keeping the previous ones",
                    extra=fields(credentials=self.credentials.description, reason=describe_error(err)),
                )

    async def _reload(self, *, initial: bool) -> None:
        cfg = _import("kubernetes.aio.client").Configuration()
        await self.credentials.load(cfg)
        host = str(cfg.host or "").rstrip("/")
        if not host.startswith(("https://", "http://")):
            raise ValueError(f"{self.credentials.description}: server {host!r} is not an http(s) URL")
        ca_pem = _read(cfg.ssl_ca_cert)
        cert_file, key_file = cfg.cert_file or None, cfg.key_file or None
        material = (ca_pem, _read(cert_file), _read(key_file))
        trust = ServerTrust(
            base_url=host,
            ca_pem=ca_pem,
            verify=bool(cfg.verify_ssl),
            server_name=cfg.tls_server_name or None,
        )
        previous = self._loaded
        changed = previous is not None and (previous.tls_material != material or previous.trust != trust)
        if previous is None or changed:
            ctx = trust.new_context()
            if cert_file and key_file:
                ctx.load_cert_chain(cert_file, key_file)
            self._ssl = ctx
            if previous is not None:
                log.info(
                    "kube-apiserver TLS settings changed; new connections use them",
                    extra=fields(credentials=self.credentials.description, server=host),
                )
        if previous is None or previous.trust != trust:
            self.trust_generation += 1
        self._loaded = _Loaded(cfg, trust, material, cfg.proxy or None)
        self._next_refresh = time.monotonic() + self.refresh_interval
        if changed:
            for listener in self._listeners:
                listener()
        if not initial:
            log.debug(
                "kube-apiserver credentials reloaded", extra=fields(credentials=self.credentials.description)
            )


def describe_error(err: BaseException) -> str:
    """A short reason for logs and readiness messages (never includes request headers)."""
    if isinstance(err, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return f"TLS verification failed: {err.certificate_error}"
    if isinstance(err, aiohttp.ClientConnectorError):
        return f"cannot connect to {err.host}:{err.port}: {err.os_error.strerror or err.os_error}"
    text = str(err) or type(err).__name__
    return text if len(text) < 300 else text[:300] + "..."
