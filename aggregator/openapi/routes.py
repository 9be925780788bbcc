"""`/openapi/v2`, `/openapi/v3` and `/openapi/v3/<group-version>`, from pre-rendered documents.

As kube-openapi's handlers (and `http.ServeContent`) answer:
- Accept is matched goautoneg-style, first acceptable clause wins, an empty header means `*/*`;
  nothing acceptable is an empty 406. v2 serves JSON and gnostic protobuf (both spellings of its
  media type); v3 documents are JSON only (kube-openapi also has protobuf; no kubectl asks for it).
- `ETag` is the quoted uppercase SHA-512 hex, `Vary: Accept`; `If-None-Match` (exact, lists, weak,
  `*`) or `If-Modified-Since` answer 304 without a body.
- v3 with `?hash=`: a stale hash gets a 301 to the current URL; the current one gets
  `Cache-Control: public, immutable` and `Expires` a year ahead (written as an HTTP date in GMT;
  upstream formats Go's RFC1123 with the local zone name).
- An unknown group-version is an empty 404, as kube-aggregator answers.
- v2 is gzip-encoded for clients that accept it (kube-openapi wraps it in a gzip handler).
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import urlencode

from aggregator.openapi.component import V2Published, V3Published
from aggregator.openapi.documents import Document, http_date
from aggregator.openapi.gnostic import CONTENT_TYPE as PROTOBUF_CONTENT_TYPE
from aggregator.openapi.gnostic import MEDIA_TYPE as PROTOBUF_MEDIA_TYPE
from aggregator.openapi.sources import V2_PATH, V3_ROOT
from aggregator.web.context import RequestContext
from aggregator.web.instrumentation import instrument_as
from aggregator.web.rendering import if_none_match
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.serverrequest import Response
from aggregator.wire.negotiation import parse_accept

ROUTE_NAME = "openapi"
JSON = "application/json"
ONE_YEAR = 365 * 24 * 3600
# (type, subtype, which rendering) in kube-openapi's order.
_V2_TYPES = (
    ("application", "json", "json"),
    ("application", PROTOBUF_MEDIA_TYPE.partition("/")[2], "protobuf"),
    ("application", PROTOBUF_CONTENT_TYPE.partition("/")[2], "protobuf"),
)
_V3_TYPES = (("application", "json", "json"),)


def negotiate(accept: str, offered: tuple[tuple[str, str, str], ...]) -> str | None:
    """goautoneg as kube-openapi uses it: the first clause (in sorted order) any offer matches."""
    for clause in parse_accept(accept or "*/*"):
        for type_, subtype, choice in offered:
            if clause.type not in (type_, "*"):
                continue
            if clause.subtype not in (subtype, "*"):
                continue
            return choice
    return None


def _not_modified(ctx: RequestContext, document: Document) -> bool:
    if ctx.headers.get("If-None-Match"):
        return if_none_match(ctx, document.quoted_etag)
    since = ctx.headers.get("If-Modified-Since")
    if not since:
        return False
    try:
        threshold = parsedate_to_datetime(since).timestamp()
        modified = parsedate_to_datetime(document.last_modified).timestamp()
    except (TypeError, ValueError):
        return False
    return modified <= threshold


def _accepts_gzip(ctx: RequestContext) -> bool:
    for part in ctx.headers.get("Accept-Encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip" and params.replace(" ", "") not in (
            "q=0",
            "q=0.0",
            "q=0.00",
            "q=0.000",
        ):
            return True
    return False


def write(
    ctx: RequestContext, document: Document, headers: dict[str, str], *, gzip_vary: bool = False
) -> Response:
    """200 with the document (gzip-encoded when it has that rendering and the client accepts it), or 304."""
    headers["Etag"] = document.quoted_etag
    if gzip_vary:
        headers["Vary"] = "Accept, Accept-Encoding"
    if _not_modified(ctx, document):
        return Response(304, headers=headers)
    headers["Content-Type"] = document.content_type
    headers["Last-Modified"] = document.last_modified
    body = document.body
    if document.gzipped is not None and _accepts_gzip(ctx):
        headers["Content-Encoding"] = "gzip"
        if not gzip_vary:  # a large v3 document: caches must key on the encoding too
            headers["Vary"] = ", ".join(v for v in (headers.get("Vary"), "Accept-Encoding") if v)
        body = document.gzipped
    return Response(200, body, headers)


class PublishedOpenAPI(Protocol):
    """What is served now: the v2 renderings and the v3 index and documents."""

    @property
    def v2(self) -> V2Published: ...

    @property
    def v3(self) -> V3Published: ...


class OpenAPIRoutes:
    def __init__(self, aggregation: PublishedOpenAPI) -> None:
        self.aggregation = aggregation
        self.route = Route(self.handle, RouteKind.OWN, ROUTE_NAME)

    def install(self, router: Router) -> None:
        router.add_exact(V2_PATH, self.route)
        router.add_exact(V3_ROOT, self.route)
        router.add_prefix(V3_ROOT + "/", self.route)

    async def handle(self, ctx: RequestContext) -> Response:
        path = ctx.path
        if path == V2_PATH:
            return self.serve_v2(ctx)
        # kube-aggregator's openapiv3 handlers are instrumented with fixed labels, no component
        if path == V3_ROOT:
            instrument_as(ctx, "openapi/v3", "")
            return self.serve_v3_index(ctx)
        instrument_as(ctx, "openapi/v3/", "")
        return self.serve_v3_document(ctx, path[len(V3_ROOT) + 1 :])

    def serve_v2(self, ctx: RequestContext) -> Response:
        choice = negotiate(ctx.headers.get("Accept", ""), _V2_TYPES)
        if choice is None:
            return Response(406, headers={"Vary": "Accept"})
        published = self.aggregation.v2
        document = published.json if choice == "json" else published.protobuf
        return write(ctx, document, {}, gzip_vary=True)

    def serve_v3_index(self, ctx: RequestContext) -> Response:
        return write(ctx, self.aggregation.v3.index, {})

    def serve_v3_document(self, ctx: RequestContext, key: str) -> Response:
        document = self.aggregation.v3.documents.get(key)
        if document is None:
            return Response(404)
        headers = {"Vary": "Accept"}
        if negotiate(ctx.headers.get("Accept", ""), _V3_TYPES) is None:
            return Response(406, headers=headers)
        requested = ctx.query_value("hash")
        if requested:
            if requested != document.etag:
                current = f"{V3_ROOT}/{key}?{urlencode({'hash': document.etag})}"
                headers.update({"Location": current, "Content-Type": JSON, "Etag": document.quoted_etag})
                return Response(301, headers=headers)
            headers["Cache-Control"] = "public, immutable"
            headers["Expires"] = http_date(time.time() + ONE_YEAR)
        return write(ctx, document, headers)
