"""Request contexts for unit tests: what the pipeline builds for a request, without a server."""

from __future__ import annotations

import time
from collections.abc import Mapping

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from aggregator.model.userinfo import UserInfo
from aggregator.web.context import RequestContext, context_of
from aggregator.web.routing import Route, RouteKind


async def _unused(_request: web.Request) -> web.StreamResponse:
    raise AssertionError("the test route's handler is never called")


TEST_ROUTE = Route(_unused, RouteKind.OWN, "test")


def context_for(
    method: str,
    target: str,
    *,
    headers: Mapping[str, str] | None = None,
    route: Route = TEST_ROUTE,
    user: UserInfo | None = None,
) -> RequestContext:
    """The context the pipeline would build for this request (a mocked aiohttp request)."""
    request = make_mocked_request(method, target, headers=dict(headers or {}))
    ctx = RequestContext.of_request(request, route, time.monotonic())
    request.gateway_context = ctx
    ctx.user = user
    return ctx


def user_of(request: web.Request) -> UserInfo:
    """The user the gates settled on (for test handlers behind a real pipeline)."""
    ctx = context_of(request)
    assert ctx is not None and ctx.user is not None
    return ctx.user


def requester_of(request: web.Request) -> UserInfo | None:
    ctx = context_of(request)
    assert ctx is not None
    return ctx.requester
