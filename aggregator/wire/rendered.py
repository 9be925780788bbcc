"""Pre-rendered discovery documents and the one way they are written to a client.

Every document is encoded once per change (compact JSON at once; indented JSON and YAML the first
time one is asked for) and carries an ETag, so serving one is a dictionary lookup, a header check
and a write: no sorting, no hashing, and no encoding after the first request for a form. The
answer itself (ETag check, gzip, 406) is `web/rendering.py`'s.
"""

from __future__ import annotations

import gzip
import hashlib
import json as jsonlib
from collections.abc import Mapping
from typing import Any

from aggregator.wire.jsonenc import encode_object, go_marshal_indent
from aggregator.wire.negotiation import YAML, MediaType
from aggregator.wire.yamlenc import go_yaml


def quoted_sha512(data: bytes) -> str:
    """Upstream's aggregated-discovery ETag form: `strconv.Quote` of uppercase hex SHA-512."""
    return '"' + hashlib.sha512(data).hexdigest().upper() + '"'


class Rendered:
    """One document in every representation, plus its ETag (quoted).

    Compact JSON (what clients ask for) and the ETag are encoded at once; the indented JSON and the
    YAML only when first asked for, then kept. A large aggregated document (kube mode: hundreds of
    KiB) takes a fraction of a second to turn into YAML, which would otherwise stall the event loop
    at every change for a representation kubectl never requests.
    """

    __slots__ = ("_document", "_gzipped", "_pretty", "_yaml", "etag", "json")

    def __init__(self, document: Mapping[str, Any], json: bytes, etag: str) -> None:
        self._document = document  # never mutated after rendering: the lazy forms read it later
        self.json = json
        self.etag = etag
        self._pretty: bytes | None = None
        self._yaml: bytes | None = None
        self._gzipped: dict[int, bytes] = {}  # by id of the uncompressed form (json, pretty, yaml)

    @classmethod
    def of(cls, document: Mapping[str, Any], etag: str | None = None) -> Rendered:
        compact = encode_object(document)
        return cls(document, compact, etag if etag is not None else quoted_sha512(compact))

    @property
    def pretty(self) -> bytes:
        # The k8s pretty serializer is `json.MarshalIndent`: no trailing newline, unlike compact JSON.
        if self._pretty is None:
            self._pretty = go_marshal_indent(self._document)
        return self._pretty

    @property
    def yaml(self) -> bytes:
        if self._yaml is None:
            self._yaml = go_yaml(self._document)
        return self._yaml

    def body(self, media: MediaType, pretty: bool) -> bytes:
        """The form `media` asks for; `pretty`: the request asked for indented JSON otherwise."""
        if media.media_type == YAML:
            return self.yaml
        return self.pretty if media.pretty or pretty else self.json

    def gzipped(self, body: bytes) -> bytes:
        """`body` (one of this document's forms) gzip-compressed at upstream's level, once."""
        packed = self._gzipped.get(id(body))
        if packed is None:
            packed = self._gzipped[id(body)] = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        return packed


_UNPARSED: Mapping[str, Any] = {}


class ParsedLater(Rendered):
    """A document held as its compact JSON and ETag alone: the indented JSON and the YAML, which
    kubectl never asks `/apis` for, parse it on first use. A large aggregated `/apis` (5000 groups)
    is several MiB as dicts, kept otherwise beside its bytes in every process that renders or
    receives it; the compact JSON is what a parse of itself encodes back to, so the forms are the
    same."""

    __slots__ = ()

    def __init__(self, json: bytes, etag: str) -> None:
        super().__init__(_UNPARSED, json, etag)

    def _parse(self) -> None:
        if self._document is _UNPARSED:
            self._document = jsonlib.loads(self.json)

    @property
    def pretty(self) -> bytes:
        self._parse()
        return Rendered.pretty.fget(self)  # type: ignore[attr-defined,no-any-return]

    @property
    def yaml(self) -> bytes:
        self._parse()
        return Rendered.yaml.fget(self)  # type: ignore[attr-defined,no-any-return]


# k8s.io/apiserver responsewriters: bodies above 128 KiB are compressed (level 1, BestSpeed) for a
# client whose Accept-Encoding lists `gzip`.
GZIP_THRESHOLD = 128 * 1024
GZIP_LEVEL = 1
