"""Who is calling the sample server, and may they?

Authentication is the requestheader scheme an aggregated API server uses (apiserver
`request/x509` + `request/headerrequest`): the TLS client certificate must verify
against the front-proxy CA and, when allowed names are configured, carry one of them as CN; only
then are `X-Remote-User` / `X-Remote-Group` / `X-Remote-Extra-*` believed. Anything else is 401.

Authorization is a small static policy standing in for the SubjectAccessReview a real extension
server would send: allowed users and groups may do everything; every authenticated user may read
discovery, OpenAPI and version information (what the `system:discovery` role grants).
"""

from __future__ import annotations

import logging
import ssl
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from aggregator.model.userinfo import UserInfo
from aggregator.tls.peerchain import IntermediatesReader, PeerChainReader
from aggregator.tls.verify import CAFile, CertificateError
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


class Unauthenticated(Exception):
    """Why a request was not authenticated (logged, never sent to the client)."""


def peer_certificate(
    request: web.Request, chain: IntermediatesReader
) -> tuple[bytes, tuple[bytes, ...]] | None:
    """The client's certificate and the intermediates it sent after it."""
    transport = request.transport
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return (der, chain.intermediates(ssl_object)) if der else None


class FrontProxyAuthenticator:
    """Verifies the front proxy's certificate, then reads the identity from its headers."""

    def __init__(
        self,
        ca: CAFile,
        allowed_names: Sequence[str],
        *,
        username_headers: Sequence[str] = ("X-Remote-User",),
        group_headers: Sequence[str] = ("X-Remote-Group",),
        extra_prefixes: Sequence[str] = ("X-Remote-Extra-",),
        peer_chain: IntermediatesReader | None = None,
    ) -> None:
        self.ca = ca
        self.peer_chain = peer_chain or PeerChainReader()
        self.allowed_names = frozenset(allowed_names)
        self.username_headers = tuple(username_headers)
        self.group_headers = tuple(group_headers)
        self.extra_prefixes = tuple(p.lower() for p in extra_prefixes)

    def authenticate(self, request: web.Request) -> UserInfo:
        presented = peer_certificate(request, self.peer_chain)
        if presented is None:
            raise Unauthenticated("no client certificate")
        der, intermediates = presented
        try:
            cert = self.ca.pool.verify(der, intermediates=intermediates)
        except CertificateError as err:
            raise Unauthenticated(f"verifying certificate: {err}") from err
        if self.allowed_names and cert.common_name not in self.allowed_names:
            raise Unauthenticated(f"x509: subject with cn={cert.common_name} is not in the allowed list")
        headers = request.headers
        name = ""
        for header in self.username_headers:
            name = headers.get(header, "")
            if name:
                break
        if not name:
            raise Unauthenticated(f"front proxy {cert.common_name!r} sent no user header")
        groups: list[str] = []
        for header in self.group_headers:
            groups.extend(v for v in headers.getall(header, []) if v)
        extra: dict[str, tuple[str, ...]] = {}
        for header, value in headers.items():
            lowered = header.lower()
            for prefix in self.extra_prefixes:
                if lowered.startswith(prefix):
                    suffix = lowered[len(prefix) :]
                    try:
                        key = urllib.parse.unquote(suffix, errors="strict")
                    except UnicodeDecodeError:
                        key = suffix
                    extra[key] = (*extra.get(key, ()), value)
        return UserInfo(name, groups=tuple(groups), extra=extra).with_authenticated_group()


# Paths every authenticated user may GET (kube-apiserver's system:discovery / system:public-info-viewer).
DISCOVERY_PATHS = ("/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz")


def is_discovery_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in DISCOVERY_PATHS)


@dataclass(frozen=True)
class StaticAuthorizer:
    """Allow listed users and groups everything; anyone authenticated may read discovery."""

    allow_users: frozenset[str]
    allow_groups: frozenset[str]

    def allowed(self, user: UserInfo, *, resource_request: bool, verb: str, path: str) -> bool:
        if user.name in self.allow_users or self.allow_groups.intersection(user.groups):
            return True
        return not resource_request and verb == "get" and is_discovery_path(path)


def log_refusal(request: web.Request, reason: str) -> None:
    log.info(
        "request not authenticated",
        extra=fields(method=request.method, path=request.path, remote=request.remote or "", reason=reason),
    )
