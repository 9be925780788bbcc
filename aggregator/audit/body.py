"""Request and response bodies for the Request and RequestResponse levels, without buffering the proxy.

The gateway streams bodies and never parses them. A `BodyCapture` is a bounded tee: the pipeline
feeds it each chunk as the chunk passes, it keeps at most `limit` bytes (64 KiB by default, enough
for nearly every object while bounding memory per in-flight request), and the audit writer thread
later turns a complete JSON body into the event's `requestObject`/`responseObject`. Anything else
is left out with an annotation saying why, so a missing object is never silent. Parsing happens on
the writer thread, never on the request path.

Upstream (`pkg/audit/request.go LogRequestObject`, `LogResponseObject`) records the decoded object
of kube-apiserver's own handlers; kube-aggregator records none for proxied requests.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

DEFAULT_BODY_LIMIT = 64 * 1024

OMITTED_SENSITIVE = "omitted: this resource carries credentials"


@dataclass(frozen=True, slots=True)
class CapturedBody:
    """What a finished (or abandoned) capture saw; immutable, so it can cross to the writer thread."""

    data: bytes
    total: int
    limit: int
    complete: bool
    content_type: str = ""
    content_encoding: str = ""
    sensitive: bool = False


@dataclass(slots=True, eq=False)
class BodyCapture:
    """A bounded tee over one streamed body: `feed()` every chunk, `finish()` at the end of the body.

    A capture that never sees `finish()` (the client or backend went away) is reported incomplete.
    For resources that carry credentials (`sensitive`), nothing is kept; only the size is counted.
    """

    limit: int = DEFAULT_BODY_LIMIT
    _: KW_ONLY
    content_type: str = ""
    content_encoding: str = ""
    sensitive: bool = False
    _buffer: bytearray = field(default_factory=bytearray, init=False)
    _total: int = field(default=0, init=False)
    _complete: bool = field(default=False, init=False)

    def feed(self, chunk: bytes) -> None:
        self._total += len(chunk)
        room = self.limit - len(self._buffer)
        if room > 0 and not self.sensitive:
            self._buffer += chunk[:room]

    def finish(self) -> None:
        self._complete = True

    @property
    def total(self) -> int:
        return self._total

    def snapshot(self) -> CapturedBody:
        return CapturedBody(
            bytes(self._buffer),
            self._total,
            self.limit,
            self._complete,
            self.content_type,
            self.content_encoding,
            self.sensitive,
        )


class _Omitted(Exception):
    """Why a body is not in the event (the annotation's value)."""


def _decompressed(body: CapturedBody) -> bytes:
    encoding = body.content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return body.data
    if encoding != "gzip":
        raise _Omitted(f"omitted: content encoding {encoding} is not decoded")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body.data, body.limit + 1)
    except zlib.error as err:
        raise _Omitted("omitted: gzip body could not be decoded") from err
    if len(data) > body.limit or inflater.unconsumed_tail:
        raise _Omitted(f"omitted: larger than the {body.limit}-byte audit body limit once decompressed")
    return data


def _strip_managed_fields(obj: Any) -> None:
    """`copyWithoutManagedFields` on JSON: an object, each item of a list, each row of a Table."""
    if not isinstance(obj, dict):
        return
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    items = obj.get("items")
    if isinstance(items, list):
        for item in items:
            _strip_managed_fields(item)
    rows = obj.get("rows")
    if obj.get("kind") == "Table" and isinstance(rows, list):
        for row in rows:
            if isinstance(row, dict):
                _strip_managed_fields(row.get("object"))


@dataclass(frozen=True, slots=True)
class DecodedBody:
    """A body as the event carries it: the JSON value, or the reason it was left out."""

    value: Any = None
    omitted: str = ""  # non-empty: no value; this is the annotation text


def decode_body(body: CapturedBody, *, omit_managed_fields: bool) -> DecodedBody | None:
    """The JSON value of a captured body, or why there is none; None when no byte was seen."""
    if body.total == 0:
        return None
    try:
        if body.sensitive:
            raise _Omitted(OMITTED_SENSITIVE)
        if not body.complete:
            raise _Omitted("omitted: the body did not complete")
        if body.total > body.limit:
            raise _Omitted(f"omitted: {body.total} bytes exceed the {body.limit}-byte audit body limit")
        data = _decompressed(body)
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError) as err:
            kind = f" ({body.content_type})" if body.content_type else ""
            raise _Omitted(f"omitted: not JSON{kind}") from err
    except _Omitted as why:
        return DecodedBody(omitted=str(why))
    if omit_managed_fields:
        _strip_managed_fields(value)
    return DecodedBody(value)
