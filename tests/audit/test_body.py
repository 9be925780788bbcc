"""The bounded body tee and what the event makes of a captured body."""

from __future__ import annotations

import gzip
import json
from typing import Any

from aggregator.audit.body import BodyCapture, DecodedBody, decode_body


def captured(
    data: bytes, *, limit: int = 64, finish: bool = True, chunk: int = 7, **kwargs: Any
) -> BodyCapture:
    capture = BodyCapture(limit, **kwargs)
    for start in range(0, len(data), chunk):
        capture.feed(data[start : start + chunk])
    if finish:
        capture.finish()
    return capture


def decoded(capture: BodyCapture, omit_managed_fields: bool = False) -> DecodedBody | None:
    return decode_body(capture.snapshot(), omit_managed_fields=omit_managed_fields)


def test_complete_json_in_chunks() -> None:
    assert decoded(captured(b'{"kind":"Flunder","spec":{"a":[1,2]}}')) == DecodedBody(
        {"kind": "Flunder", "spec": {"a": [1, 2]}}
    )


def test_keeps_at_most_the_limit_but_counts_everything() -> None:
    capture = captured(b"x" * 1000, limit=64)
    snapshot = capture.snapshot()
    assert (len(snapshot.data), snapshot.total) == (64, 1000)
    assert decoded(capture) == DecodedBody(omitted="omitted: 1000 bytes exceed the 64-byte audit body limit")


def test_exactly_the_limit_is_kept() -> None:
    body = json.dumps({"k": "v" * 50}).encode()
    assert decoded(captured(body, limit=len(body))) == DecodedBody({"k": "v" * 50})


def test_no_body_means_no_object_and_no_annotation() -> None:
    assert decoded(captured(b"")) is None
    assert decoded(captured(b"", finish=False)) is None


def test_a_body_that_never_finished_is_left_out() -> None:
    assert decoded(captured(b'{"a":1}', finish=False)) == DecodedBody(
        omitted="omitted: the body did not complete"
    )


def test_not_json_names_the_content_type() -> None:
    proto = captured(b"k8s\x00\x0a\x0f", content_type="application/vnd.kubernetes.protobuf")
    assert decoded(proto) == DecodedBody(omitted="omitted: not JSON (application/vnd.kubernetes.protobuf)")
    assert decoded(captured(b"a: b\n")) == DecodedBody(omitted="omitted: not JSON")


def test_gzip_is_decoded_within_the_limit() -> None:
    body = gzip.compress(b'{"kind":"List","items":[]}')
    assert decoded(captured(body, content_encoding="gzip")) == DecodedBody({"kind": "List", "items": []})
    bomb = gzip.compress(b'{"a":"' + b"x" * 10_000 + b'"}')
    assert len(bomb) < 64
    assert decoded(captured(bomb, content_encoding="gzip")) == DecodedBody(
        omitted="omitted: larger than the 64-byte audit body limit once decompressed"
    )
    assert decoded(captured(b"not gzip", content_encoding="gzip")) == DecodedBody(
        omitted="omitted: gzip body could not be decoded"
    )
    assert decoded(captured(b"x", content_encoding="br")) == DecodedBody(
        omitted="omitted: content encoding br is not decoded"
    )


def test_sensitive_bodies_are_never_kept() -> None:
    capture = captured(b'{"spec":{"token":"s3cr3t"}}', sensitive=True)
    assert capture.snapshot().data == b""
    assert decoded(capture) == DecodedBody(omitted="omitted: this resource carries credentials")


def test_managed_fields_are_stripped_from_objects_lists_and_tables() -> None:
    mf = [{"manager": "kubectl"}]
    obj = {"metadata": {"name": "a", "managedFields": mf}}
    lst = {"kind": "FlunderList", "metadata": {}, "items": [obj, {"metadata": {"managedFields": mf}}]}
    table = {"kind": "Table", "rows": [{"cells": [], "object": obj}]}
    for doc, expected in (
        (obj, {"metadata": {"name": "a"}}),
        (
            lst,
            {"kind": "FlunderList", "metadata": {}, "items": [{"metadata": {"name": "a"}}, {"metadata": {}}]},
        ),
        (table, {"kind": "Table", "rows": [{"cells": [], "object": {"metadata": {"name": "a"}}}]}),
    ):
        capture = captured(json.dumps(doc).encode(), limit=4096)
        assert decoded(capture, omit_managed_fields=True) == DecodedBody(expected)
        assert decoded(capture, omit_managed_fields=False) == DecodedBody(doc)
