"""The sample's own answers, as aiohttp responses: Status errors and JSON objects.

The gateway writes its answers through its protocol-neutral `ServerRequest`; the sample is a plain
aiohttp application, so it builds aiohttp responses, with kube-apiserver's rules for indentation
and the Status shape (`aggregator.model.status`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aggregator.model.status import NOT_FOUND_MESSAGE, status_body
from aggregator.wire.jsonenc import encode_object

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_PRETTY_AGENTS = ("curl", "Wget", "Mozilla/5.0")


def wants_pretty(request: web.BaseRequest) -> bool:
    """Upstream's rule: `?pretty=<ParseBool>` wins, else curl, Wget and browsers get indented JSON."""
    pretty = request.query.get("pretty")
    if pretty:
        return pretty in _TRUE
    return request.headers.get("User-Agent", "").startswith(_PRETTY_AGENTS)


def json_response(request: web.BaseRequest, obj: Any, *, status: int = 200) -> web.Response:
    return web.Response(
        body=encode_object(obj, pretty=wants_pretty(request)), status=status, content_type="application/json"
    )


def status_response(
    request: web.BaseRequest, code: int, message: str, *, details: dict[str, Any] | None = None
) -> web.Response:
    """A Kubernetes Status with the matching HTTP code."""
    return json_response(request, status_body(code, message, details=details), status=code)


def not_found(request: web.BaseRequest) -> web.Response:
    """kube-apiserver's answer for a path nothing serves."""
    return status_response(request, 404, NOT_FOUND_MESSAGE, details={})
