"""Request and response heads between HTTP/2's header lists and the pipeline's headers.

A request's pseudo-headers become the method and request target; its fields get Go's canonical
names (`textproto.CanonicalMIMEHeaderKey`, as Go's HTTP/2 server gives a handler and as an
HTTP/1.1 kubectl sends them), so a backend sees the same header names whichever protocol the
client spoke, and `:authority` becomes `Host`.

What must hold for a request to be forwarded is checked here, whatever the HTTP/2 library already
refused: a method that is a token and a `:path` without whitespace or control characters (RFC 9113
8.3.1: malformed, a stream error; such a `:path` written into a backend's HTTP/1.1 request line
would let the backend route a path other than the one authorized), no CONNECT and no `:protocol`
(extended CONNECT is not offered). Field values with CR, LF or NUL never get here: libnghttp2
refuses them (RFC 9113 8.2.1), and `backends/h1.serialize_head` checks again where bytes become
a request.

A response's fields lose what RFC 9113 forbids (the connection-specific fields HTTP/1.1 framing
uses), `Connection: close` becomes a request to end the connection, as Go's server reads it
(server.go `writeChunk`), and `date`, `content-length` and a default `content-type` are added as
the HTTP/1.1 side adds them, so both protocols answer with the same fields.
"""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from typing import Any

from multidict import CIMultiDict

# RFC 9113 8.2.2: connection-specific fields never appear in HTTP/2.
CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
# Go caps its canonical-name cache too (CVE-2022-41717).
_CACHE_LIMIT = 1000
# RFC 9110 5.6.2 token.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A `:path` byte that is whitespace, a control character or DEL.
_BAD_PATH_BYTE = re.compile(rb"[\x00-\x20\x7f]")
_STATUS = {code: str(code).encode() for code in range(100, 600)}


class BadRequest(ValueError):
    """A request head Go's server refuses with a stream error (server.go `newWriterAndRequest`)."""


class RequestHead:
    """What a request's header list says: method, target (and its path and query), headers."""

    __slots__ = ("headers", "method", "raw_path", "raw_query", "target")

    def __init__(self, method: str, target: str, headers: CIMultiDict[str]) -> None:
        self.method = method
        self.target = target
        path = target.partition("#")[0]
        self.raw_path, _, self.raw_query = path.partition("?")
        self.headers = headers


class HeaderNames:
    """Go's canonical form of each lowercase field name, cached (bounded)."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, str] = {}

    def canonical(self, name: bytes) -> str:
        known = self._cache.get(name)
        if known is not None:
            return known
        text = name.decode("utf-8", "surrogateescape")
        canonical = "-".join(part[:1].upper() + part[1:] for part in text.split("-"))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[name] = canonical
        return canonical

    def request(self, fields: list[tuple[bytes, bytes]]) -> RequestHead:
        """The head of a request; raises BadRequest where Go's server would refuse it."""
        method = path = authority = b""
        headers: CIMultiDict[str] = CIMultiDict()
        canonical = self.canonical
        for name, value in fields:
            if name[:1] == b":":
                if name == b":method":
                    method = value
                elif name == b":path":
                    path = value
                elif name == b":authority":
                    authority = value
                elif name == b":protocol":
                    raise BadRequest("extended CONNECT is not offered")
                continue
            headers.add(canonical(name), value.decode("utf-8", "surrogateescape"))
        if not _TOKEN.fullmatch(method):
            raise BadRequest(f"bad :method {method!r}")
        if method == b"CONNECT":
            raise BadRequest("CONNECT is not served over HTTP/2")
        if _BAD_PATH_BYTE.search(path):
            raise BadRequest(f"bad :path {path!r}: whitespace or control characters")
        target = path.decode("utf-8", "surrogateescape")
        if not target.startswith("/") and not (target == "*" and method == b"OPTIONS"):
            raise BadRequest(f"bad :path {target!r}")
        if authority and "Host" not in headers:
            headers["Host"] = authority.decode("utf-8", "surrogateescape")
        return RequestHead(method.decode("ascii"), target, headers)


class HttpDate:
    """The `date` field's value, formatted once per second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


class ResponseFields:
    """Response header lists as libnghttp2 takes them: lowercase names, with the fields HTTP/1.1
    framing would have added (see the module docstring); lowercase names are cached."""

    __slots__ = ("_date", "_lower")

    def __init__(self) -> None:
        self._lower: dict[str, bytes] = {}
        self._date = HttpDate()

    def encode(
        self, status: int, headers: CIMultiDict[str], length: int | None
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The header list of a response whose body has `length` bytes (None: streamed), and
        whether it asked for the connection to end."""
        fields = [(b":status", _STATUS.get(status) or str(status).encode())]
        close = False
        lower_of = self._lower
        seen_date = seen_type = seen_length = False
        for name, value in headers.items():
            lower = lower_of.get(name)
            if lower is None:
                lowered = name.lower()
                if lowered in CONNECTION_SPECIFIC:
                    if lowered == "connection" and value.strip().lower() == "close":
                        close = True
                    continue
                lower = lowered.encode("utf-8", "surrogateescape")
                if len(lower_of) < _CACHE_LIMIT:
                    lower_of[name] = lower
            if lower == b"date":
                seen_date = True
            elif lower == b"content-type":
                seen_type = True
            elif lower == b"content-length":
                seen_length = True
            fields.append((lower, value.encode("utf-8", "surrogateescape")))
        empty_status = status < 200 or status in (204, 304)
        if length is not None and not seen_length and not empty_status:
            fields.append((b"content-length", str(length).encode()))
        if not seen_type and length != 0 and not empty_status:
            fields.append((b"content-type", b"application/octet-stream"))
        if not seen_date:
            fields.append((b"date", self._date.now()))
        return fields, close


class NameValueArrays:
    """Packs header lists into `nghttp2_nv` arrays: one buffer of names and values, and the
    array's pointers and lengths written with `struct` in one call, instead of a cffi attribute
    assignment per field (libnghttp2 copies both during `nghttp2_submit_response`)."""

    __slots__ = ("_ffi", "_formats")

    # name, value (pointers), namelen, valuelen (size_t), flags (uint8_t) and padding to 40 bytes.
    ENTRY = "PPNNB7x"

    def __init__(self, ffi: Any) -> None:
        self._ffi = ffi
        self._formats: dict[int, Any] = {}

    def pack(self, fields: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
        """(the `nghttp2_nv[]`, the buffer its pointers point into: keep both until submitted)."""
        import struct

        ffi = self._ffi
        count = len(fields)
        blob = b"".join(part for field in fields for part in field)
        data = ffi.from_buffer(blob)
        base = int(ffi.cast("uintptr_t", data))
        values: list[int] = []
        offset = base
        for name, value in fields:
            name_length, value_length = len(name), len(value)
            values += (offset, offset + name_length, name_length, value_length, 0)
            offset += name_length + value_length
        packer = self._formats.get(count)
        if packer is None:
            packer = self._formats[count] = struct.Struct("@" + self.ENTRY * count)
        array = ffi.new("nghttp2_nv[]", count)
        packer.pack_into(ffi.buffer(array), 0, *values)
        return array, data
