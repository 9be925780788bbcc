"""Rendered OpenAPI documents: bytes, ETag and Last-Modified, computed once per change.

kube-openapi's ETag is the uppercase hex SHA-512 of the served bytes (unquoted in `?hash=`, quoted in
the `ETag` header). A document can carry a gzip rendering too: kube-openapi wraps `/openapi/v2` in
a gzip handler, and kube-apiserver's whole v2 document is megabytes of JSON.
"""

from __future__ import annotations

import gzip
import hashlib
import time
from dataclasses import dataclass, field
from email.utils import formatdate

# gziphandler's DefaultMinSize: smaller bodies are not worth compressing.
GZIP_MIN_SIZE = 1400
# Any document larger than this is also kept gzipped (kube-apiserver compresses its API responses
# above 128 KiB): a v3 group-version of kube-apiserver's can be megabytes.
LARGE = 128 * 1024


def sha512_hex(data: bytes) -> str:
    """kube-openapi's `computeETag`: `fmt.Sprintf("%X", sha512.Sum512(data))`."""
    return hashlib.sha512(data).hexdigest().upper()


def http_date(timestamp: float) -> str:
    """An HTTP date (`Mon, 02 Jan 2006 15:04:05 GMT`)."""
    return formatdate(timestamp, usegmt=True)


@dataclass(frozen=True, slots=True)
class Document:
    """One representation of one document, ready to write."""

    body: bytes
    content_type: str
    etag: str  # unquoted uppercase hex
    last_modified: str
    gzipped: bytes | None = field(default=None, repr=False)

    @property
    def quoted_etag(self) -> str:
        return f'"{self.etag}"'

    @classmethod
    def render(
        cls,
        body: bytes,
        content_type: str = "application/json",
        *,
        etag: str | None = None,
        compress: bool = False,
        modified: float | None = None,
    ) -> Document:
        if compress and len(body) >= GZIP_MIN_SIZE:
            gzipped: bytes | None = gzip.compress(body, compresslevel=6, mtime=0)
        elif len(body) > LARGE:
            gzipped = gzip.compress(body, compresslevel=1, mtime=0)  # once per document, not per request
        else:
            gzipped = None
        return cls(
            body=body,
            content_type=content_type,
            etag=etag if etag is not None else sha512_hex(body),
            last_modified=http_date(time.time() if modified is None else modified),
            gzipped=gzipped,
        )
