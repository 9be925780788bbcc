"""Responses the gateway writes itself: Status errors and negotiated API objects."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aggregator.model.status import NOT_FOUND_MESSAGE, status_body
from aggregator.web.context import RequestContext, context_of
from aggregator.wire.jsonenc import encode_object

# The Status a response carries, kept beside it for the audit's `responseStatus` (upstream's
# `LogResponseObject` records the Status its handlers write, not its bytes).
STATUS = web.ResponseKey[dict[str, Any]]("aggregator.status")

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_PRETTY_AGENTS = ("curl", "Wget", "Mozilla/5.0")

# Who asked: the request's context, or (a handler's view) the protocol's request object.
Asker = RequestContext | web.BaseRequest | None


def wants_pretty(asker: Asker) -> bool:
    """Upstream's rule: `?pretty=<ParseBool>` wins, else curl, Wget and browsers get indented JSON."""
    if asker is None:
        return False
    ctx = asker if isinstance(asker, RequestContext) else context_of(asker)
    if ctx is not None:
        return ctx.pretty
    assert isinstance(asker, web.BaseRequest)
    pretty = asker.query.get("pretty")
    if pretty:
        return pretty in _TRUE
    return asker.headers.get("User-Agent", "").startswith(_PRETTY_AGENTS)


def json_response(request: Asker, obj: Any, *, status: int = 200) -> web.Response:
    pretty = wants_pretty(request)
    return web.Response(
        body=encode_object(obj, pretty=pretty), status=status, content_type="application/json"
    )


def status_response(
    request: Asker,
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A Kubernetes Status with the matching HTTP code."""
    body = status_body(code, message, reason=reason, details=details)
    response = json_response(request, body, status=code)
    response[STATUS] = body
    if headers:
        response.headers.update(headers)
    return response


def not_found(request: Asker) -> web.Response:
    """kube-apiserver's answer for a path nothing serves."""
    return status_response(request, 404, NOT_FOUND_MESSAGE, details={})
