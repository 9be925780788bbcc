"""Pre-rendered documents (`wire/rendered.py`) as HTTP answers: ETags, gzip, and upstream's 406."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from aggregator.web.responses import wants_pretty
from aggregator.wire.negotiation import JSON, MediaType, not_acceptable_body
from aggregator.wire.rendered import GZIP_THRESHOLD, Rendered


def accepts_gzip(request: web.Request) -> bool:
    """`negotiateContentEncoding`: the first Accept-Encoding value, split on commas, has a token
    exactly `gzip` (so `gzip;q=1` does not count, as upstream)."""
    header = request.headers.get("Accept-Encoding", "")
    return bool(header) and any(token.strip() == "gzip" for token in header.split(","))


def if_none_match(request: web.Request, etag: str) -> bool:
    """True when the client already holds `etag` (exact header match as upstream, or RFC 9110 lists)."""
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    if header == etag:
        return True
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


def respond(
    request: web.Request,
    rendered: Rendered,
    media: MediaType,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """200 with the negotiated representation, or 304 when the client's copy is current."""
    out = {"ETag": rendered.etag}
    if headers:
        out.update(headers)
    if if_none_match(request, rendered.etag):
        return web.Response(status=304, headers=out)
    out["Content-Type"] = content_type or media.media_type
    body = rendered.body(media, wants_pretty(request))
    if len(body) > GZIP_THRESHOLD and accepts_gzip(request):
        response = web.Response(body=rendered.gzipped(body), headers=out)
        response.headers["Content-Encoding"] = "gzip"
        response.headers.add("Vary", "Accept-Encoding")  # upstream adds a second Vary line
        return response
    return web.Response(body=body, headers=out)


def not_acceptable() -> web.Response:
    """Upstream's 406 for a request that accepts none of the types served."""
    return web.Response(status=406, body=not_acceptable_body(), headers={"Content-Type": JSON})
