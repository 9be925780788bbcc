"""Negotiation and conditional requests of the OpenAPI handlers, without sockets."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.openapi.documents import Document, http_date
from aggregator.openapi.routes import _V2_TYPES, _V3_TYPES, negotiate, write
from tests.support.contexts import context_for

PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


@pytest.mark.parametrize(
    ("accept", "v2", "v3"),
    [
        ("", "json", "json"),  # empty means */*
        ("*/*", "json", "json"),
        ("application/*", "json", "json"),
        (PROTOBUF, "protobuf", None),
        ("application/com.github.proto-openapi.spec.v2.v1.0+protobuf", "protobuf", None),
        (f"application/json;q=0.9, {PROTOBUF}", "protobuf", "json"),  # higher q first
        (f"{PROTOBUF}, application/json", "protobuf", "json"),
        ("text/html", None, None),
        ("text/*, application/json;q=0.9", "json", "json"),  # text/* serves nothing here
        ("application/json;q=0", "json", "json"),  # q=0 still matches, as upstream
    ],
)
def test_negotiation(accept: str, v2: str | None, v3: str | None) -> None:
    assert negotiate(accept, _V2_TYPES) == v2
    assert negotiate(accept, _V3_TYPES) == v3


def _request(**headers: str) -> Any:
    return context_for("GET", "/openapi/v2", headers=headers)


DOC = Document.render(
    b'{"swagger":"2.0","padding":"' + b"x" * 4000 + b'"}', compress=True, modified=1_700_000_000
)


def test_if_modified_since_and_if_none_match() -> None:
    assert write(_request(), DOC, {}).status == 200
    assert write(_request(**{"If-Modified-Since": http_date(1_700_000_000)}), DOC, {}).status == 304
    assert write(_request(**{"If-Modified-Since": http_date(1_699_999_999)}), DOC, {}).status == 200
    assert write(_request(**{"If-Modified-Since": "yesterday"}), DOC, {}).status == 200
    # If-None-Match decides alone when present, as in Go's ServeContent
    stale = {"If-None-Match": '"OTHER"', "If-Modified-Since": http_date(1_800_000_000)}
    assert write(_request(**stale), DOC, {}).status == 200
    assert write(_request(**{"If-None-Match": "*"}), DOC, {}).status == 304
    not_modified = write(_request(**{"If-None-Match": DOC.quoted_etag}), DOC, {})
    assert not_modified.body == b"" and "Content-Type" not in not_modified.headers
    assert not_modified.headers["Etag"] == DOC.quoted_etag


def test_gzip_only_when_accepted() -> None:
    assert DOC.gzipped is not None
    assert write(_request(**{"Accept-Encoding": "gzip, deflate"}), DOC, {}).body == DOC.gzipped
    assert write(_request(**{"Accept-Encoding": "deflate, gzip;q=0"}), DOC, {}).body == DOC.body
    assert write(_request(), DOC, {}).body == DOC.body
    small = Document.render(b"{}", compress=True)
    assert small.gzipped is None  # below gziphandler's minimum size
