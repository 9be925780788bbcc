"""Authentication, in upstream's order: front-proxy headers, client certificate, bearer token,
then a bearer token offered as a WebSocket subprotocol (`wire/wsprotocol.py`).

This is the delegating authenticator extension API servers use (`DelegatingAuthenticatorConfig`):
a union in which the first success wins and failures accumulate. If nothing succeeds and anything
failed (a certificate from an unknown CA, a rejected token), the request gets upstream's 401 Status.
A request with no credentials at all is anonymous when `--anonymous-auth` is on, and on public
routes (the health probes kubelet calls without a certificate); otherwise it is a 401 too.
The certificate path never awaits: verification results are cached per certificate.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from aggregator.auth.requestheader import RequestHeaderConfig, user_from_headers
from aggregator.model.userinfo import ANONYMOUS, UserInfo
from aggregator.tls.verify import CAPool, Rejection
from aggregator.util.logs import fields
from aggregator.web.context import set_user
from aggregator.web.responses import status_response
from aggregator.web.routing import Route
from aggregator.wire.wsprotocol import ProtocolTokenError, protocol_token

log = logging.getLogger(__name__)

CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


class AuthenticationError(Exception):
    """Credentials were presented and are wrong (or could not be checked): a 401, never anonymous."""


class TokenAuthenticator(Protocol):
    """Bearer tokens: a static token file, TokenReview... Returns the user, None if unknown.

    May return the user directly (a cache hit) or an awaitable (a review in flight), so that cache
    hits cost no await. Raises AuthenticationError when the token cannot be checked.
    """

    def authenticate_token(self, token: str) -> UserInfo | Awaitable[UserInfo | None] | None: ...


def peer_certificate(request: web.Request) -> bytes | None:
    """The DER of the client's certificate, if it presented one."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return None
    der: bytes | None = ssl_object.getpeercert(binary_form=True)
    return der


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def unauthorized(request: web.Request) -> web.Response:
    return status_response(request, 401, "Unauthorized")


class Authenticator:
    """The authentication gate; CA sources are callables so files and ConfigMaps can swap them live."""

    def __init__(
        self,
        *,
        anonymous: bool,
        client_ca: Callable[[], CAPool | None] = lambda: None,
        requestheader: Callable[[], RequestHeaderConfig | None] = lambda: None,
        tokens: list[TokenAuthenticator] | None = None,
    ) -> None:
        self.anonymous = anonymous
        self.client_ca = client_ca
        self.requestheader = requestheader
        self.tokens: list[TokenAuthenticator] = tokens or []

    async def gate(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        errors: list[str] = []
        user = self._from_certificate(request, errors)
        token = None
        if user is None:
            token = bearer_token(request)
            if token is not None:
                user = await self._from_token(token, errors)
        if user is None:
            offered = self._from_protocol(request, errors)
            if offered is not None:
                token = offered
                user = await self._from_token(offered, errors, source="websocket protocol token")
        if user is None:
            if errors or token is not None:
                log.info(
                    "unable to authenticate the request",
                    extra=fields(
                        method=request.method,
                        path=request.path,
                        reason="; ".join(errors) or "invalid bearer token",
                    ),
                )
                return unauthorized(request)
            if not (self.anonymous or route.public):
                return unauthorized(request)
            user = ANONYMOUS
        else:
            user = user.with_authenticated_group()
        set_user(request, user)
        return None

    def _from_certificate(self, request: web.Request, errors: list[str]) -> UserInfo | None:
        der = peer_certificate(request)
        if der is None:
            return None
        front_proxy = self.requestheader()
        if front_proxy is not None:
            proxy_cert = front_proxy.pool.check(der)
            if isinstance(proxy_cert, Rejection):
                errors.append(f"front-proxy certificate: {proxy_cert.message}")
            elif front_proxy.allowed_names and proxy_cert.common_name not in front_proxy.allowed_names:
                errors.append(
                    f"front-proxy certificate: x509: subject with cn={proxy_cert.common_name} is not in "
                    "the allowed list"
                )
            else:
                user = user_from_headers(request.headers, front_proxy)
                if user is not None:
                    return user
        pool = self.client_ca()
        if pool is not None:
            cert = pool.check(der)
            if isinstance(cert, Rejection):
                errors.append(f"client certificate: {cert.message}")
            else:
                return UserInfo(
                    cert.common_name,
                    groups=cert.organizations,
                    extra={CREDENTIAL_ID_KEY: (f"X509SHA256={cert.sha256}",)},
                )
        return None

    @staticmethod
    def _from_protocol(request: web.Request, errors: list[str]) -> str | None:
        """The token a WebSocket upgrade offers as a subprotocol (`ProtocolAuthenticator`); the
        proxy drops that entry before the request reaches a backend."""
        try:
            return protocol_token(request.headers)
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
