"""Authentication, in upstream's order: front-proxy headers, client certificate, bearer token,
then a bearer token offered as a WebSocket subprotocol (`wire/wsprotocol.py`).

This is the delegating authenticator extension API servers use (`DelegatingAuthenticatorConfig`):
a union in which the first success wins and failures accumulate. If nothing succeeds and anything
failed (a certificate from an unknown CA, a rejected token), the request gets upstream's 401 Status.
A request with no credentials at all is anonymous when `--anonymous-auth` is on, and on public
routes (the health probes kubelet calls without a certificate); otherwise it is a 401 too.
The certificate path never awaits: verification results are cached per presented chain (the
client's certificate plus the intermediates it sent, which Go passes as `Intermediates`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.auth.requestheader import RequestHeaderConfig, user_from_headers
from aggregator.model.userinfo import ANONYMOUS, ANONYMOUS_USER, UNAUTHENTICATED_GROUP, UserInfo
from aggregator.tls.peerchain import IntermediatesReader, PeerChainReader
from aggregator.tls.verify import CAPool, ClientCertificate, Rejection, chain_key
from aggregator.util.logs import fields
from aggregator.web.context import HTTP2, Connection, RequestContext
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Response
from aggregator.wire.wsprotocol import ProtocolTokenError, protocol_token

log = logging.getLogger(__name__)

CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True, slots=True)
class _Authenticated:
    user: UserInfo
    complete: bool  # system:authenticated already added


class AuthenticationError(Exception):
    """Credentials were presented and are wrong (or could not be checked): a 401, never anonymous."""


class TokenAuthenticator(Protocol):
    """Bearer tokens: a static token file, TokenReview... Returns the user, None if unknown.

    May return the user directly (a cache hit) or an awaitable (a review in flight), so that cache
    hits cost no await. Raises AuthenticationError when the token cannot be checked.
    """

    def authenticate_token(self, token: str) -> UserInfo | Awaitable[UserInfo | None] | None: ...


@dataclass(slots=True)
class _Presented:
    """What one TLS connection presented (read once, not per request), and the user the client CA
    last made of it: a keep-alive client costs a dictionary lookup per request, and the pool's
    own check (expiry, a reloaded CA) still runs every time."""

    der: bytes
    intermediates: tuple[bytes, ...]
    key: bytes
    verified: ClientCertificate | None = None
    user: _Authenticated | None = None  # `verified`'s user, system:authenticated added


_NOTHING = _Presented(b"", (), b"")


def bearer_token(headers: CIMultiDictProxy[str]) -> str | None:
    header = headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def is_anonymous(user: UserInfo) -> bool:
    """filters/authentication.go `isAnonymousUser`."""
    return user.name == ANONYMOUS_USER or UNAUTHENTICATED_GROUP in user.groups


def limit_unauthenticated_http2(ctx: RequestContext, status: int, _headers: CIMultiDict[str]) -> None:
    """UnauthenticatedHTTP2DOSMitigation (filters/authentication.go, on by default;
    CVE-2023-44487, CVE-2023-39325): an HTTP/2 connection ends after an answer to a caller whose
    credentials the gateway refused (its own 401), or that it served as anonymous (the
    authenticated user, before any impersonation): "limit this connection to just this request".
    Upstream sets `Connection: close`, which Go's HTTP/2 server turns into a GOAWAY; a head
    listener does the same here. A 401 relayed from a backend is the backend's answer, not the
    gateway's refusal: the connection stays open, as upstream's proxy leaves it."""
    if ctx.connection.protocol != HTTP2:
        return
    user = ctx.requester or ctx.user
    if (status == 401 and not ctx.handled) or (user is not None and is_anonymous(user)):
        ctx.request.close_connection("unauthenticated")


def unauthorized(ctx: RequestContext) -> Response:
    return status_response(ctx, 401, "Unauthorized")


class Authenticator:
    """The authentication gate; CA sources are callables so files and ConfigMaps can swap them live.

    `peer_chain` reads the intermediates a client sent (default: OpenSSL's peer chain).
    """

    def __init__(
        self,
        *,
        anonymous: bool,
        client_ca: Callable[[], CAPool | None] = lambda: None,
        requestheader: Callable[[], RequestHeaderConfig | None] = lambda: None,
        tokens: list[TokenAuthenticator] | None = None,
        peer_chain: IntermediatesReader | None = None,
    ) -> None:
        self.anonymous = anonymous
        self.peer_chain = peer_chain or PeerChainReader()
        self.client_ca = client_ca
        self.requestheader = requestheader
        self.tokens: list[TokenAuthenticator] = tokens or []

    def gate(self, ctx: RequestContext) -> Response | Awaitable[Response | None] | None:
        """The user, from the certificate without an await; a token's review is awaited."""
        errors: list[str] = []
        user = self._from_certificate(ctx, errors)
        if user is not None:
            ctx.user = user.user if user.complete else user.user.with_authenticated_group()
            return None
        if not errors and "Authorization" not in ctx.headers and not ctx.upgrade:
            # No credentials at all (no token can be offered without those headers).
            if not (self.anonymous or ctx.route.public):
                return unauthorized(ctx)
            ctx.user = ANONYMOUS
            return None
        return self._from_tokens(ctx, errors)

    async def _from_tokens(self, ctx: RequestContext, errors: list[str]) -> Response | None:
        """A bearer token, or one offered as a WebSocket subprotocol; else anonymous or a 401."""
        found: UserInfo | None = None
        token = bearer_token(ctx.headers)
        if token is not None:
            found = await self._from_token(token, errors)
        if found is None:
            offered = self._from_protocol(ctx, errors)
            if offered is not None:
                token = offered
                found = await self._from_token(offered, errors, source="websocket protocol token")
        if found is None:
            if errors or token is not None:
                log.info(
                    "unable to authenticate the request",
                    extra=fields(
                        method=ctx.method,
                        path=ctx.path,
                        reason="; ".join(errors) or "invalid bearer token",
                    ),
                )
                return unauthorized(ctx)
            if not (self.anonymous or ctx.route.public):
                return unauthorized(ctx)
            found = ANONYMOUS
        else:
            found = found.with_authenticated_group()
        ctx.user = found
        return None

    def _presented(self, connection: Connection) -> _Presented:
        """The connection's certificates, read from the TLS session once per connection."""
        presented = connection.presented
        if isinstance(presented, _Presented):
            return presented
        ssl_object = connection.ssl_object
        der: bytes | None = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is None or ssl_object is None:
            presented = _NOTHING
        else:
            intermediates = self.peer_chain.intermediates(ssl_object)
            presented = _Presented(der, intermediates, chain_key(der, intermediates))
        connection.presented = presented
        return presented

    def _from_certificate(self, ctx: RequestContext, errors: list[str]) -> _Authenticated | None:
        presented = self._presented(ctx.connection)
        if presented is _NOTHING:
            return None
        der, intermediates, key = presented.der, presented.intermediates, presented.key
        # Why the front proxy did not vouch for the caller: told (in `errors`) only when the client
        # CA does not either, so a client certificate's request formats nothing.
        proxy_problem: Rejection | str | None = None
        front_proxy = self.requestheader()
        if front_proxy is not None:
            proxy_cert = front_proxy.pool.check(der, intermediates=intermediates, key=key)
            if isinstance(proxy_cert, Rejection):
                proxy_problem = proxy_cert
            elif front_proxy.allowed_names and proxy_cert.common_name not in front_proxy.allowed_names:
                proxy_problem = (
                    f"x509: subject with cn={proxy_cert.common_name} is not in the allowed list"
                )
            else:
                asserted = user_from_headers(ctx.headers, front_proxy)
                if asserted is not None:
                    return _Authenticated(asserted, complete=False)
        pool = self.client_ca()
        cert = pool.check(der, intermediates=intermediates, key=key) if pool is not None else None
        if cert is not None and not isinstance(cert, Rejection):
            if presented.verified is not cert or presented.user is None:
                presented.verified = cert
                presented.user = _Authenticated(
                    UserInfo(
                        cert.common_name,
                        groups=cert.organizations,
                        extra={CREDENTIAL_ID_KEY: (f"X509SHA256={cert.sha256}",)},
                    ).with_authenticated_group(),
                    complete=True,
                )
            return presented.user
        if proxy_problem is not None:
            message = proxy_problem.message if isinstance(proxy_problem, Rejection) else proxy_problem
            errors.append(f"front-proxy certificate: {message}")
        if cert is not None:
            # x509.go `Authenticator.AuthenticateRequest` wraps the crypto/x509 error this way.
            errors.append(f"client certificate: verifying certificate {cert.certificate} failed: {cert.message}")
        return None

    @staticmethod
    def _from_protocol(ctx: RequestContext, errors: list[str]) -> str | None:
        """The token a WebSocket upgrade offers as a subprotocol (`ProtocolAuthenticator`); the
        proxy drops that entry before the request reaches a backend."""
        try:
            return protocol_token(ctx.headers)
        except ProtocolTokenError as err:
            errors.append(f"websocket protocol token: {err}")
            return None

    async def _from_token(
        self, token: str, errors: list[str], *, source: str = "bearer token"
    ) -> UserInfo | None:
        failed = False
        for authenticator in self.tokens:
            try:
                result = authenticator.authenticate_token(token)
                if inspect.isawaitable(result):
                    result = await result
            except AuthenticationError as err:
                errors.append(f"{source}: {err}")
                failed = True
                continue
            if result is not None:
                return result
        if not failed:
            errors.append(f"{source}: invalid bearer token")
        return None
