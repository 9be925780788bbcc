"""Pre-rendered documents (`wire/rendered.py`) as HTTP answers: ETags, gzip, and upstream's 406."""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

from aggregator.web.context import RequestContext
from aggregator.web.serverrequest import Response
from aggregator.wire.negotiation import JSON, MediaType, not_acceptable_body
from aggregator.wire.rendered import GZIP_THRESHOLD, Rendered


def accepts_gzip(ctx: RequestContext) -> bool:
    """`negotiateContentEncoding`: the first Accept-Encoding value, split on commas, has a token
    exactly `gzip` (so `gzip;q=1` does not count, as upstream)."""
    header = ctx.headers.get("Accept-Encoding", "")
    return bool(header) and any(token.strip() == "gzip" for token in header.split(","))


def if_none_match(ctx: RequestContext, etag: str) -> bool:
    """True when the client already holds `etag` (exact header match as upstream, or RFC 9110 lists)."""
    header = ctx.headers.get("If-None-Match")
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
    ctx: RequestContext,
    rendered: Rendered,
    media: MediaType,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """200 with the negotiated representation, or 304 when the client's copy is current."""
    out: CIMultiDict[str] = CIMultiDict(ETag=rendered.etag)
    if headers:
        out.update(headers)
    if if_none_match(ctx, rendered.etag):
        return Response(304, headers=out)
    out["Content-Type"] = content_type or media.media_type
    body = rendered.body(media, ctx.pretty)
    if len(body) > GZIP_THRESHOLD and accepts_gzip(ctx):
        out["Content-Encoding"] = "gzip"
        out.add("Vary", "Accept-Encoding")  # upstream adds a second Vary line
        return Response(200, rendered.gzipped(body), out)
    return Response(200, body, out)


def not_acceptable() -> Response:
    """Upstream's 406 for a request that accepts none of the types served."""
    return Response(406, not_acceptable_body(), content_type=JSON)
