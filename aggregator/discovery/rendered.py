"""Pre-rendered discovery documents and the one way they are written to a client.

Every document is encoded once per change in each representation a client may ask for (compact JSON,
indented JSON, YAML) and carries an ETag, so serving one is a dictionary lookup, a header check and
a write: no sorting, no encoding, no hashing per request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aggregator.discovery.negotiation import JSON, YAML, MediaType, not_acceptable_body
from aggregator.discovery.yamlenc import go_yaml
from aggregator.model.jsonenc import encode_object, go_marshal_indent
from aggregator.responses import wants_pretty


def quoted_sha512(data: bytes) -> str:
    """Upstream's aggregated-discovery ETag form: `strconv.Quote` of uppercase hex SHA-512."""
    return '"' + hashlib.sha512(data).hexdigest().upper() + '"'


@dataclass(frozen=True, slots=True)
class Rendered:
    """One document in every representation, plus its ETag (quoted)."""

    json: bytes
    pretty: bytes
    yaml: bytes
    etag: str

    @classmethod
    def of(cls, document: Mapping[str, Any], etag: str | None = None) -> Rendered:
        compact = encode_object(document)
        return cls(
            json=compact,
            # The k8s pretty serializer is `json.MarshalIndent`: no trailing newline, unlike compact JSON.
            pretty=go_marshal_indent(document),
            yaml=go_yaml(document),
            etag=etag if etag is not None else quoted_sha512(compact),
        )

    def body(self, media: MediaType, request: web.Request) -> bytes:
        if media.media_type == YAML:
            return self.yaml
        return self.pretty if media.pretty or wants_pretty(request) else self.json


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
    return web.Response(body=rendered.body(media, request), headers=out)


def not_acceptable() -> web.Response:
    """Upstream's 406 for a request that accepts none of the types served."""
    return web.Response(status=406, body=not_acceptable_body(), headers={"Content-Type": JSON})
