"""Pre-rendered documents: gzip above 128 KiB for clients that accept it, compressed once."""

from __future__ import annotations

import gzip

import pytest

from aggregator.web.context import RequestContext
from aggregator.web.rendering import accepts_gzip, respond
from aggregator.wire.negotiation import JSON, MediaType
from aggregator.wire.rendered import GZIP_THRESHOLD, ParsedLater, Rendered
from tests.support.contexts import context_for

MEDIA = MediaType(JSON, None, False)


def big() -> Rendered:
    return Rendered.of(
        {"kind": "Big", "items": [{"name": f"item-{i:06d}", "pad": "x" * 40} for i in range(3000)]}
    )


def request(**headers: str) -> RequestContext:
    return context_for("GET", "/apis", headers=headers)


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("deflate, gzip", True),
        ("gzip, br", True),
        (" gzip ", True),
        ("gzip;q=1", False),  # upstream compares whole tokens
        ("br", False),
        ("", False),
    ],
)
def test_accept_encoding_is_read_as_upstream_does(header: str, accepted: bool) -> None:
    assert accepts_gzip(request(**({"Accept-Encoding": header} if header else {}))) is accepted


def test_a_large_document_is_gzipped_once_and_keeps_its_etag() -> None:
    rendered = big()
    assert len(rendered.json) > GZIP_THRESHOLD
    first = respond(request(**{"Accept-Encoding": "gzip"}), rendered, MEDIA)
    second = respond(request(**{"Accept-Encoding": "gzip"}), rendered, MEDIA)
    assert first.headers["Content-Encoding"] == "gzip"
    assert first.headers.getall("Vary") == ["Accept-Encoding"]
    assert first.headers["ETag"] == rendered.etag
    assert first.body is second.body  # compressed per render, not per request
    assert isinstance(first.body, bytes) and gzip.decompress(first.body) == rendered.json
    plain = respond(request(), rendered, MEDIA)
    assert "Content-Encoding" not in plain.headers and plain.body is rendered.json
    not_modified = respond(
        request(**{"Accept-Encoding": "gzip", "If-None-Match": rendered.etag}), rendered, MEDIA
    )
    assert not_modified.status == 304 and not not_modified.body


def test_a_small_document_is_never_compressed() -> None:
    small = Rendered.of({"kind": "Small"})
    response = respond(request(**{"Accept-Encoding": "gzip"}), small, MEDIA)
    assert "Content-Encoding" not in response.headers


def test_a_document_held_as_its_bytes_gives_the_same_forms() -> None:
    """`ParsedLater` (the aggregated `/apis` of the renderer and of each worker) keeps no parsed
    copy: its indented JSON and YAML, parsed from the compact JSON on first use, are those of the
    document it was rendered from, HTML-escaped characters and key order included."""
    document = {"kind": "List", "items": [{"name": "a<b>&c", "n": 3, "ok": True, "none": None}], "z": {}}
    whole = Rendered.of(document)
    held = ParsedLater(whole.json, whole.etag)
    assert (held.json, held.etag) == (whole.json, whole.etag)
    assert held.pretty == whole.pretty
    assert held.yaml == whole.yaml
