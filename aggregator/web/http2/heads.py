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
import struct
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
# Methods that are tokens, checked without the expression (what clients send).
_KNOWN_METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"})
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


class CanonicalNames(dict[bytes, str]):
    """Go's canonical form of each lowercase field name, computed on a miss and cached (bounded):
    a lookup is one subscript. A pseudo-header here (after the regular fields) is refused."""

    def __missing__(self, name: bytes) -> str:
        if name[:1] == b":":
            raise BadRequest(f"pseudo-header {name!r} after the regular fields")
        text = name.decode("utf-8", "surrogateescape")
        canonical = "-".join(part[:1].upper() + part[1:] for part in text.split("-"))
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        self[name] = canonical
        return canonical


class HeaderNames:
    """Request heads from decoded header lists, with Go's canonical field names."""

    __slots__ = ("_canonical",)

    def __init__(self) -> None:
        self._canonical = CanonicalNames()

    def request(self, fields: list[tuple[bytes, bytes]]) -> RequestHead:
        """The head of a request; raises BadRequest where Go's server would refuse it."""
        method = path = authority = b""
        regular = 0  # where the regular fields start: pseudo-headers come first (RFC 9113 8.3)
        for name, value in fields:
            if name[:1] != b":":
                break
            regular += 1
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            elif name == b":protocol":
                raise BadRequest("extended CONNECT is not offered")
        canonical = self._canonical
        pairs: list[tuple[str, str]] = []
        append = pairs.append
        for name, value in fields[regular:]:
            append((canonical[name], value.decode("utf-8", "surrogateescape")))
        headers: CIMultiDict[str] = CIMultiDict(pairs)  # built in one call, not a call per field
        if method not in _KNOWN_METHODS and not _TOKEN.fullmatch(method):
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


class LowerNames(dict[str, bytes]):
    """The lowercase form of each response field name, computed on a miss and cached (bounded):
    a lookup is one subscript. The connection-specific names map to b"" (never sent)."""

    def __missing__(self, name: str) -> bytes:
        lowered = name.lower()
        lower = b"" if lowered in CONNECTION_SPECIFIC else lowered.encode("utf-8", "surrogateescape")
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        self[name] = lower
        return lower


class ResponseHeads:
    """Response heads as libnghttp2 takes them: an `nghttp2_nv` array of lowercase names and
    values, with the fields HTTP/1.1 framing would have added (see the module docstring).

    One pass over the handler's headers writes both the array's entries (pointers and lengths,
    packed with `struct` in one call instead of a cffi assignment per field) and the bytes they
    point to, into one buffer allocated once: the array first (room for `ENTRIES` fields), the
    names and values after it, so every pointer is known as its field is read. libnghttp2 copies
    both during `nghttp2_submit_response`, so the buffer is reused by the next `pack`: what `pack`
    returns is valid until then (one event loop thread; the caller submits at once). A head too
    large for the buffer gets buffers of its own. Lowercase names are cached.

    A field seen twice (the same name and value: a backend's `Server`, `Cache-Control`, the flow
    control UIDs, an object's `ETag`) gets an entry of its own, its lowercase name and encoded
    value in bytes kept alive with it: from then on the field costs a dict lookup and the entry's
    five numbers, not a lowercase lookup, an encoding and its offsets. Bounded: the cache starts
    again empty once it holds `CACHED` fields (at the start of a `pack`, never while an array
    built from it waits to be submitted)."""

    __slots__ = (
        "_array",
        "_base",
        "_cached",
        "_date",
        "_ffi",
        "_formats",
        "_held",
        "_lower",
        "_once",
        "_view",
    )

    # name, value (pointers), namelen, valuelen (size_t), flags (uint8_t) and padding to 40 bytes.
    ENTRY = "PPNNB7x"
    ENTRY_SIZE = 40
    # Fields the shared buffer has entries for (a typical answer has a dozen), then its names and
    # values.
    ENTRIES = 64
    BUFFER = 16 * 1024
    # Fields with entries of their own (and as many seen once) before the cache starts again.
    CACHED = 512

    def __init__(self, ffi: Any) -> None:
        self._ffi = ffi
        self._lower = LowerNames()
        self._date = HttpDate()
        self._formats: dict[int, struct.Struct] = {}
        self._cached: dict[tuple[str, str], tuple[int, int, int, int, int]] = {}
        self._held: list[Any] = []  # what the cached entries point into
        self._once: set[tuple[str, str]] = set()
        buffer = ffi.new("char[]", self.BUFFER)
        self._view = ffi.buffer(buffer)
        self._base = int(ffi.cast("uintptr_t", buffer))
        self._array = ffi.cast("nghttp2_nv *", buffer)  # keeps `buffer` alive

    def pack(self, status: int, headers: CIMultiDict[str], length: int | None) -> tuple[Any, int, Any, bool]:
        """The `nghttp2_nv[]` of a response whose body has `length` bytes (None: streamed), its
        length, what its pointers point into (keep it until submitted), and whether the handler
        asked for the connection to end."""
        base = self._base
        start = offset = base + self.ENTRY_SIZE * self.ENTRIES
        code = _STATUS.get(status) or str(status).encode()
        values: list[int] = [offset, offset + 7, 7, len(code), 0]
        parts: list[bytes] = [b":status", code]
        offset += 7 + len(code)
        close = False
        lower_of = self._lower
        if len(self._cached) >= self.CACHED or len(self._once) >= self.CACHED:
            self._forget_fields()
        cached = self._cached
        cached_count = 0
        for item in headers.items():
            entry = cached.get(item)
            if entry is not None:
                values += entry
                cached_count += 1
                continue
            name, value = item
            lower = lower_of[name]
            if not lower:  # connection-specific
                if name.lower() == "connection" and value.strip().lower() == "close":
                    close = True
                continue
            if item in self._once:
                self._cache(item, lower, value)
            else:
                self._once.add(item)
            encoded = value.encode("utf-8", "surrogateescape")
            name_length = len(lower)
            value_length = len(encoded)
            values += (offset, offset + name_length, name_length, value_length, 0)
            parts += (lower, encoded)
            offset += name_length + value_length
        if "Content-Length" not in headers or "Content-Type" not in headers or "Date" not in headers:
            for lower, encoded in self._framing(status, length, headers):
                name_length = len(lower)
                value_length = len(encoded)
                values += (offset, offset + name_length, name_length, value_length, 0)
                parts += (lower, encoded)
                offset += name_length + value_length
        count = (len(parts) >> 1) + cached_count
        if count > self.ENTRIES or offset - base > self.BUFFER:
            parts = self._parts(status, headers, length)
            array, data = self._own(parts)
            return array, len(parts) >> 1, data, close
        packer = self._formats.get(count)
        if packer is None:
            packer = self._formats[count] = struct.Struct("@" + self.ENTRY * count)
        view = self._view
        packer.pack_into(view, 0, *values)
        view[start - base : offset - base] = b"".join(parts)
        return self._array, count, None, close

    def _cache(self, item: tuple[str, str], lower: bytes, value: str) -> None:
        """An entry of its own for a field seen before."""
        held = lower + value.encode("utf-8", "surrogateescape")
        pointer = int(self._ffi.cast("uintptr_t", self._ffi.from_buffer(held)))
        self._held.append(held)
        self._cached[item] = (pointer, pointer + len(lower), len(lower), len(held) - len(lower), 0)

    def _forget_fields(self) -> None:
        self._cached = {}
        self._held = []
        self._once = set()

    def _parts(self, status: int, headers: CIMultiDict[str], length: int | None) -> list[bytes]:
        """Every name and value of a head, in turn (for a head too large for the shared buffer)."""
        parts = [b":status", _STATUS.get(status) or str(status).encode()]
        for name, value in headers.items():
            lower = self._lower[name]
            if lower:
                parts += (lower, value.encode("utf-8", "surrogateescape"))
        for lower, encoded in self._framing(status, length, headers):
            parts += (lower, encoded)
        return parts

    def _framing(self, status: int, length: int | None, headers: CIMultiDict[str]) -> list[tuple[bytes, bytes]]:
        """The fields HTTP/1.1's framing adds that the handler's headers lack."""
        added: list[tuple[bytes, bytes]] = []
        empty_status = status < 200 or status in (204, 304)
        if length is not None and "Content-Length" not in headers and not empty_status:
            added.append((b"content-length", str(length).encode()))
        if "Content-Type" not in headers and length != 0 and not empty_status:
            added.append((b"content-type", b"application/octet-stream"))
        if "Date" not in headers:
            added.append((b"date", self._date.now()))
        return added

    def _own(self, parts: list[bytes]) -> tuple[Any, Any]:
        """A head larger than the shared buffer: an array and a buffer of its own."""
        ffi = self._ffi
        count = len(parts) >> 1
        data = ffi.from_buffer(b"".join(parts))
        offset = int(ffi.cast("uintptr_t", data))
        values: list[int] = []
        for index in range(0, len(parts), 2):
            name_length, value_length = len(parts[index]), len(parts[index + 1])
            values += (offset, offset + name_length, name_length, value_length, 0)
            offset += name_length + value_length
        array = ffi.new("nghttp2_nv[]", count)
        struct.pack_into("@" + self.ENTRY * count, ffi.buffer(array), 0, *values)
        return array, data
