"""Answers the gateway writes itself: Status errors and negotiated API objects."""

from __future__ import annotations

from typing import Any

from aggregator.model.status import NOT_FOUND_MESSAGE, status_body
from aggregator.web.context import RequestContext
from aggregator.web.serverrequest import Response
from aggregator.wire.jsonenc import encode_object

JSON = "application/json"


def json_response(ctx: RequestContext | None, obj: Any, *, status: int = 200) -> Response:
    """`obj` as JSON, indented when the caller asked for it (`RequestContext.pretty`)."""
    pretty = ctx is not None and ctx.pretty
    return Response(status, encode_object(obj, pretty=pretty), content_type=JSON)


def status_response(
    ctx: RequestContext | None,
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A Kubernetes Status with the matching HTTP code."""
    body = status_body(code, message, reason=reason, details=details)
    response = json_response(ctx, body, status=code)
    response.status_object = body
    if headers:
        response.headers.update(headers)
    return response


def not_found(ctx: RequestContext | None) -> Response:
    """kube-apiserver's answer for a path nothing serves."""
    return status_response(ctx, 404, NOT_FOUND_MESSAGE, details={})


async def serve_not_found(ctx: RequestContext) -> Response:
    """The fallback route of local mode: nothing else serves the path."""
    return not_found(ctx)
