"""One backend: its TLS context, its keep-alive pool, the one way it is dialed, and how failures read.

Every connection to a backend, whether for a proxied request, an upgrade tunnel, a discovery or
OpenAPI fetch or an availability probe, is opened by `Backend.dial`, and every failure is worded
by `dial` (connect and handshake) or `describe` (after the connection was made) the way Go's
transport words it, so the 503 a client sees, the availability condition and `aggregator check`
name the same cause: `dial tcp 10.0.0.5:443: connect: connection refused`, `tls: failed to verify
certificate: x509: certificate is valid for a.svc, not b.svc`, `remote error: tls: bad certificate`.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import TypeVar

import aiohttp
from cryptography import x509

from aggregator.backends import tlsdiag
from aggregator.backends._aiohttp import (
    BufferedReads,
    HttpProcessingError,
    ResponseHandler,
    response_protocol,
)
from aggregator.backends.addresses import is_ip
from aggregator.backends.errors import BackendError, Hop, classify
from aggregator.backends.h1 import KEEPALIVE, DialTimes, H1Pool, IdleConnections, serialize_head
from aggregator.backends.tls import client_context
from aggregator.contracts import FetchedResponse
from aggregator.tls.pem import CertKeyPair
from aggregator.util.hostport import join_host_port

CONNECT_TIMEOUT = 5.0
# A backend that refused the client certificate is asked why at most this often per address.
ALERT_TTL = 5.0
# Methods Go's transport retries once when a pooled connection turns out to be closed.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})

P = TypeVar("P", bound=asyncio.BaseProtocol)


@dataclass(frozen=True, slots=True)
class Address:
    """Where to connect: the address dialed and the name its certificate must hold."""

    host: str
    port: int
    server_name: str | None  # None: the host itself

    @property
    def authority(self) -> str:
        return join_host_port(self.host, self.port)

    @property
    def tls_name(self) -> str:
        return self.server_name or self.host


@dataclass(eq=False)
class Backend:
    """One TLS setting's context and connection pool (shared by APIServices with equal settings)."""

    name: str
    _: KW_ONLY
    context: ssl.SSLContext | None
    # Why the context could not be built (upstream's transportBuildingError): requests get a 500.
    error: str | None = None
    client_pair: CertKeyPair | None = None
    keepalive: InitVar[float] = KEEPALIVE
    # The bound on idle connections this backend shares with the others (the registry's).
    idle: InitVar[IdleConnections | None] = None
    # TLS answers read through `BufferedReads` (the control process, where a 256 KiB read buffer
    # per record is a mapping); elsewhere uvloop's own reads, without BufferedReads' copy.
    buffered_reads: bool = False
    pool: H1Pool = field(init=False)
    _diag_context: ssl.SSLContext | None = field(default=None, init=False)
    # (host, port, server name) -> (expiry, the look in progress or done): see `diagnose`.
    _alerts: dict[tuple[str, int, str], tuple[float, asyncio.Future[str | None]]] = field(
        default_factory=dict, init=False
    )
    retired: bool = field(default=False, init=False)

    def __post_init__(self, keepalive: float, idle: IdleConnections | None) -> None:
        everyone_idle = idle if idle is not None else IdleConnections()
        self.pool = H1Pool(self._dial_http, keepalive=keepalive, everyone_idle=everyone_idle)

    # --- connections -------------------------------------------------------------------------------

    async def dial(
        self,
        address: Address,
        factory: Callable[[], P],
        *,
        within: float = CONNECT_TIMEOUT,
        times: DialTimes | None = None,
    ) -> tuple[asyncio.Transport, P]:
        """TCP connect and TLS handshake within `within` seconds; a failure raises BackendError in Go's words.

        An IP address (every APIService target) is connected first and handshaken on the connected
        socket, so that `times` can tell the two phases apart (a hung TCP connect is a dead host, a
        hung handshake a stopped process); a host name goes through the loop's own resolver."""
        loop = asyncio.get_running_loop()
        # The failure is worded inside the handler and raised outside it: a dead backend's every
        # failed dial carries no chain of the socket error and its traceback.
        failure: BackendError
        try:
            async with asyncio.timeout(within):
                if times is not None and self.context is not None and is_ip(address.host):
                    transport, protocol = await self._dial_timed(address, factory, times)
                else:
                    transport, protocol = await loop.create_connection(
                        factory,
                        address.host,
                        address.port,
                        ssl=self.context or False,
                        server_hostname=address.tls_name if self.context is not None else None,
                    )
            return transport, protocol
        except TimeoutError:
            failure = BackendError(Hop.CONNECT, f"dial tcp {address.authority}: i/o timeout")
        except ssl.SSLCertVerificationError as err:
            cause, certificate = await self.explain_verification(address, err)
            failure = BackendError(Hop.TLS, cause, verification=True, certificate=certificate)
        except (OSError, ssl.SSLError) as err:
            failure = BackendError(*classify(err, address.authority))
        raise failure

    async def _dial_timed(
        self, address: Address, factory: Callable[[], P], times: DialTimes
    ) -> tuple[asyncio.Transport, P]:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in address.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            started = loop.time()
            await loop.sock_connect(sock, (address.host, address.port))
            connected = loop.time()
            times.tcp = connected - started
            transport, protocol = await loop.create_connection(
                factory, sock=sock, ssl=self.context, server_hostname=address.tls_name
            )
            times.tls = loop.time() - connected
        except BaseException:
            sock.close()
            raise
        return transport, protocol

    async def _dial_http(
        self, host: str, port: int, server_name: str | None, within: float | None, times: DialTimes | None
    ) -> ResponseHandler:
        handler = response_protocol(asyncio.get_running_loop())
        buffered = self.buffered_reads and self.context is not None  # plain TCP: exact slices already
        await self.dial(
            Address(host, port, server_name),
            (lambda: BufferedReads(handler)) if buffered else (lambda: handler),
            within=CONNECT_TIMEOUT if within is None else within,
            times=times,
        )
        return handler

    async def describe(self, err: BaseException, address: Address) -> BackendError:
        """A failure after the connection was made, in Go's words; a bare EOF or reset right after
        the handshake becomes the TLS alert the backend sent, when it sent one."""
        if isinstance(err, BackendError):
            return err
        if isinstance(err, HttpProcessingError):
            return BackendError(Hop.CONNECT, f"malformed HTTP response: {err.message}")
        if isinstance(err, aiohttp.ServerDisconnectedError | asyncio.IncompleteReadError):
            hop, cause = Hop.CONNECT, "EOF"
        else:
            hop, cause = classify(err, address.authority)
        hop, cause = await self.diagnose(hop, cause, address)
        return BackendError(hop, cause)

    # --- the gateway's own requests ----------------------------------------------------------------

    async def get(
        self,
        address: Address,
        target: str,
        headers: Callable[[], Iterable[tuple[str, str]]],
        *,
        max_body: int,
    ) -> FetchedResponse:
        """GET `target` and read the whole answer (at most `max_body` bytes of it).

        `headers` are built once there is a connection (a dial that fails costs no headers).
        Redirects are returned, never followed. Raises BackendError; the caller bounds the time.
        """
        head = b""
        for attempt in (1, 2):
            exchange = await self.pool.exchange(address.host, address.port, address.server_name)
            try:
                head = head or serialize_head("GET", target, headers())
                exchange.send(head, None, chunked=False, head_only=False)
                message, payload = await exchange.response()
                body = bytearray()
                while len(body) < max_body:
                    chunk = await payload.readany()
                    if not chunk:
                        break
                    body += chunk
                return FetchedResponse(message.code, message.headers, bytes(body[:max_body]))
            except aiohttp.ServerDisconnectedError as err:
                if attempt == 1 and exchange.reused:
                    continue  # a pooled connection the backend had just closed: Go retries once
                failure = await self.describe(err, address)
            except (aiohttp.ClientError, HttpProcessingError, OSError, asyncio.IncompleteReadError) as err:
                failure = await self.describe(err, address)
            finally:
                exchange.finish()
            raise failure  # worded from the error, without its chain
        raise AssertionError("unreachable")

    # --- failure detail ----------------------------------------------------------------------------

    async def explain_verification(
        self, address: Address, err: BaseException
    ) -> tuple[str, x509.Certificate | None]:
        """Go's wording for a failed verification, after an unverified look at the certificate."""
        cert_err = getattr(err, "certificate_error", err)
        code = int(getattr(cert_err, "verify_code", 0) or 0)
        message = str(getattr(cert_err, "verify_message", "") or cert_err)
        if self._diag_context is None:
            self._diag_context = client_context(None, insecure=True, client_pair=self.client_pair)
        cert = await tlsdiag.peer_certificate(
            address.host, address.port, address.tls_name, self._diag_context
        )
        return tlsdiag.explain(cert, address.tls_name, code, message), cert

    async def diagnose(self, hop: Hop, cause: str, address: Address) -> tuple[Hop, str]:
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
        key = (address.host, address.port, address.tls_name)
        entry = self._alerts.get(key)
        if entry is None or entry[0] <= loop.time():
            if len(self._alerts) > 256:
                self._alerts.clear()
            look = asyncio.ensure_future(
                tlsdiag.alert_after_handshake(address.host, address.port, address.tls_name, context)
            )
            entry = self._alerts[key] = (loop.time() + ALERT_TTL, look)
        alert = await asyncio.shield(entry[1])
        return (Hop.TLS, alert) if alert is not None else (hop, cause)

    # --- lifetime ----------------------------------------------------------------------------------

    def retire(self) -> None:
        """No new requests: idle connections close now, the rest when their exchange ends (watches
        are not cut)."""
        self.retired = True
        self.pool.close()

    async def close(self) -> None:
        self.retire()
