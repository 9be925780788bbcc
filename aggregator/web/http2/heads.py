"""Request and response heads between HTTP/2's header lists and the pipeline's headers.

A request's pseudo-headers become the method and request target; its fields get Go's canonical
names (`textproto.CanonicalMIMEHeaderKey`, as Go's HTTP/2 server gives a handler and as an
HTTP/1.1 kubectl sends them), so a backend sees the same header names whichever protocol the
client spoke, and `:authority` becomes `Host`. A response's fields lose what RFC 9113 forbids
(the connection-specific fields aiohttp adds for HTTP/1.1 framing), and `Connection: close` becomes
a request to end the connection, as Go's server reads it (server.go `writeChunk`).
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

# RFC 9113 8.2.2: connection-specific fields never appear in HTTP/2.
CONNECTION_SPECIFIC = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
)
# Go caps its canonical-name cache too (CVE-2022-41717).
_CACHE_LIMIT = 1000


class BadRequest(ValueError):
    """A request head Go's server refuses with a stream error (server.go `newWriterAndRequest`)."""


class RequestHead:
    """What a request's header list says: method, target, authority and headers."""

    __slots__ = ("authority", "headers", "method", "target")

    def __init__(self, method: str, target: str, authority: str, headers: CIMultiDict[str]) -> None:
        self.method = method
        self.target = target
        self.authority = authority
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

    def request(self, fields: Iterable[tuple[bytes, bytes]]) -> RequestHead:
        """The head of a request; raises BadRequest where Go's server would refuse it."""
        method = target = authority = ""
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in fields:
            if name[:1] == b":":
                if name == b":method":
                    method = value.decode("ascii", "surrogateescape")
                elif name == b":path":
                    target = value.decode("utf-8", "surrogateescape")
                elif name == b":authority":
                    authority = value.decode("utf-8", "surrogateescape")
                elif name == b":protocol":
                    raise BadRequest("extended CONNECT is not offered")
                continue
            headers.add(self.canonical(name), value.decode("utf-8", "surrogateescape"))
        if method == "CONNECT":
            raise BadRequest("CONNECT is not served over HTTP/2")
        if not target.startswith("/") and not (target == "*" and method == "OPTIONS"):
            raise BadRequest(f"bad :path {target!r}")
        if authority and "Host" not in headers:
            headers["Host"] = authority
        return RequestHead(method, target, authority, headers)


def response_fields(
    status: str, headers: Iterable[tuple[str, str]]
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The header list of a response, and whether it asked for the connection to end."""
    fields = [(b":status", status.encode("ascii"))]
    close = False
    for name, value in headers:
        lower = name.lower()
        if lower in CONNECTION_SPECIFIC:
            if lower == "connection" and value.strip().lower() == "close":
                close = True
            continue
        fields.append((lower.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape")))
    return fields, close
