"""Typed keys for what the pipeline attaches to a request."""

from __future__ import annotations

from aiohttp import web

from aggregator.model.userinfo import UserInfo
from aggregator.web.routing import Route

USER = web.RequestKey("aggregator.user", UserInfo)
# Set only when the caller impersonates someone: USER is then the impersonated user.
REQUESTER = web.RequestKey("aggregator.requester", UserInfo)
ROUTE = web.RequestKey("aggregator.route", Route)


def set_user(request: web.Request, user: UserInfo) -> None:
    request[USER] = user


def get_user(request: web.Request) -> UserInfo | None:
    return request.get(USER)


def set_requester(request: web.Request, user: UserInfo) -> None:
    request[REQUESTER] = user


def get_requester(request: web.Request) -> UserInfo | None:
    """Who authenticated, when it acts as someone else (an audit event's `user`, whose
    `impersonatedUser` is `get_user`; apiserver `audit.LogImpersonatedUser`). None otherwise."""
    return request.get(REQUESTER)


def set_route(request: web.Request, route: Route) -> None:
    request[ROUTE] = route


def get_route(request: web.Request) -> Route:
    return request[ROUTE]


AUTHORIZATION = web.RequestKey[tuple[bool, str]]("aggregator.authorization")


def set_authorization(request: web.Request, allowed: bool, reason: str) -> None:
    """The gateway's authorization decision and its reason (the audit's `authorization.k8s.io/*`
    annotations, which kube-apiserver's `WithAuthorization` adds)."""
    request[AUTHORIZATION] = (allowed, reason)


def get_authorization(request: web.Request) -> tuple[bool, str] | None:
    return request.get(AUTHORIZATION)
