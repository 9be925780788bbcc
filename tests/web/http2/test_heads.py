"""Response heads as libnghttp2 takes them (`heads.ResponseHeads`): the same fields whether a
field is packed into the shared buffer or comes from the cache of fields seen before, the fields
HTTP/1.1's framing would add when the handler did not, and a cache that starts again when full."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from aggregator.web.http2 import nghttp2
from aggregator.web.http2.heads import ResponseHeads

binding, _why = nghttp2.load()
pytestmark = pytest.mark.skipif(binding is None, reason="libnghttp2 is not installed")

Fields = list[tuple[bytes, bytes]]


def packed(
    heads: ResponseHeads, status: int, headers: CIMultiDict[str], length: int | None
) -> tuple[Fields, bool]:
    """The nv array's names and values (read back from the memory it points to), and `close`."""
    assert binding is not None
    ffi = binding.ffi
    array, count, _data, close = heads.pack(status, headers, length)
    read: Any = ffi.unpack
    fields = []
    for i in range(count):
        name = read(ffi.cast("char *", array[i].name), array[i].namelen)
        fields.append((name, read(ffi.cast("char *", array[i].value), array[i].valuelen)))
    return fields, close


def proxied_answer(audit_id: str) -> CIMultiDict[str]:
    return CIMultiDict(
        [
            ("Audit-Id", audit_id),
            ("Cache-Control", "no-cache, private"),
            ("Content-Type", "application/json"),
            ("Content-Length", "700"),
            ("Date", "Sat, 28 Nov 2026 01:35:16 GMT"),
            ("Server", "nginx"),
            ("X-Kubernetes-Pf-Flowschema-Uid", "6f3e"),
            ("Connection", "keep-alive"),
        ]
    )


def test_a_field_seen_before_packs_to_the_same_bytes() -> None:
    assert binding is not None
    heads = ResponseHeads(binding.ffi)
    for n in range(4):  # the first sighting, the second (cached then), and cached ones
        fields, close = packed(heads, 200, proxied_answer(f"audit-{n}"), 700)
        assert fields == [
            (b":status", b"200"),
            (b"audit-id", f"audit-{n}".encode()),
            (b"cache-control", b"no-cache, private"),
            (b"content-type", b"application/json"),
            (b"content-length", b"700"),
            (b"date", b"Sat, 28 Nov 2026 01:35:16 GMT"),
            (b"server", b"nginx"),
            (b"x-kubernetes-pf-flowschema-uid", b"6f3e"),
        ]
        assert not close


def test_framing_fields_are_added_when_missing_whether_the_others_are_cached_or_not() -> None:
    assert binding is not None
    heads = ResponseHeads(binding.ffi)
    for _ in range(3):
        fields, _close = packed(heads, 200, CIMultiDict([("Content-Type", "text/plain"), ("Server", "x")]), 5)
        names = [name for name, _value in fields]
        assert names == [b":status", b"content-type", b"server", b"content-length", b"date"]
        assert fields[3] == (b"content-length", b"5")
        fields, _close = packed(heads, 204, CIMultiDict([("Server", "x")]), 0)
        assert [name for name, _value in fields] == [b":status", b"server", b"date"]


def test_connection_close_is_seen_every_time_and_never_sent() -> None:
    assert binding is not None
    heads = ResponseHeads(binding.ffi)
    for _ in range(3):
        fields, close = packed(heads, 200, CIMultiDict([("Connection", "close"), ("X-A", "1")]), 0)
        assert close
        assert [name for name, _value in fields] == [b":status", b"x-a", b"content-length", b"date"]


class SmallCache(ResponseHeads):
    CACHED = 3


def test_the_cache_starts_again_when_full_and_answers_stay_the_same() -> None:
    assert binding is not None
    heads = SmallCache(binding.ffi)
    for n in range(20):
        headers = CIMultiDict([(f"X-{n % 7}", str(n % 5)), ("X-Same", "v"), ("Content-Type", "a/b")])
        fields, _close = packed(heads, 200, headers, 1)
        assert fields[:4] == [
            (b":status", b"200"),
            (f"x-{n % 7}".encode(), str(n % 5).encode()),
            (b"x-same", b"v"),
            (b"content-type", b"a/b"),
        ]
        assert len(heads._cached) <= SmallCache.CACHED + 3  # at most one head's fields past the bound


def test_a_head_larger_than_the_shared_buffer_has_one_of_its_own() -> None:
    assert binding is not None
    heads = ResponseHeads(binding.ffi)
    headers = CIMultiDict([(f"X-{i}", "v" * 400) for i in range(70)])
    for _ in range(3):
        fields, _close = packed(heads, 200, headers, 0)
        assert len(fields) == 1 + 70 + 2  # :status, the fields, content-length, date
        assert fields[1:71] == [(f"x-{i}".encode(), b"v" * 400) for i in range(70)]
