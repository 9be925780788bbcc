"""Go's `net/url` unescaping and query parsing, so request attributes match what a Go server sees.

The gateway authorizes a request on behalf of the extension API server (and kube-apiserver) behind
it; both parse the path and query with Go's `net/url`. Deciding on a differently decoded path
would authorize something other than what the backend serves, so the decoding rules are Go's:
`%2F` in a path is a `/`, `+` is a space only in queries, a malformed escape is an error, and a
query pair containing `;` or a bad escape is silently dropped (`URL.Query()` ignores errors).
"""

from __future__ import annotations

_HEX = frozenset("0123456789abcdefABCDEF")


class EscapeError(ValueError):
    """A `%` not followed by two hex digits (Go's `url.EscapeError`)."""

    def __init__(self, sequence: str) -> None:
        super().__init__(f"invalid URL escape {sequence!r}")
        self.sequence = sequence


def _unescape(text: str, *, plus_is_space: bool) -> str:
    if "%" not in text and not (plus_is_space and "+" in text):
        return text
    out = bytearray()
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "%":
            if i + 2 >= n or text[i + 1] not in _HEX or text[i + 2] not in _HEX:
                raise EscapeError(text[i : i + 3])
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
            continue
        if ch == "+" and plus_is_space:
            out.append(0x20)
        else:
            out.extend(ch.encode("utf-8", "surrogateescape"))
        i += 1
    return out.decode("utf-8", "replace")


def path_unescape(text: str) -> str:
    """Go's `url.PathUnescape` (and how `URL.Path` is decoded): `+` stays `+`."""
    return _unescape(text, plus_is_space=False)


def query_unescape(text: str) -> str:
    """Go's `url.QueryUnescape`: `+` is a space."""
    return _unescape(text, plus_is_space=True)


def parse_query(raw: str) -> dict[str, list[str]]:
    """Go's `URL.Query()`: `&`-separated pairs, bad pairs dropped, values in order of appearance."""
    values: dict[str, list[str]] = {}
    if not raw:
        return values
    for pair in raw.split("&"):
        if not pair or ";" in pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key = query_unescape(key)
            value = query_unescape(value)
        except EscapeError:
            continue
        values.setdefault(key, []).append(value)
    return values
