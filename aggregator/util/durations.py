"""Go duration strings (`10s`, `1m30s`, `500ms`), read as Go's `time.ParseDuration` reads them: for
kube-apiserver's duration flags (pflag) and a request's `?timeout=`."""

from __future__ import annotations

# Go's time.unitMap, in nanoseconds; both micro signs (U+00B5, U+03BC) are accepted.
_GO_UNITS = {
    b"ns": 1,
    b"us": 1_000,
    "µs".encode(): 1_000,
    "μs".encode(): 1_000,
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}
_MAX_NS = 1 << 63


def _time_quote(raw: bytes) -> str:
    """Go's `time.quote`, which the time package's errors use instead of `strconv.Quote`
    (`model.fielderrors.go_quote`): `"`-wrapped, `"` and `\\` escaped, every non-ASCII or
    control byte as `\\xNN` (printable Unicode included, unlike strconv)."""
    out = ['"']
    for byte in raw:
        if byte >= 0x80 or byte < 0x20:
            out.append(f"\\x{byte:02x}")
        else:
            char = chr(byte)
            out.append("\\" + char if char in '"\\' else char)
    out.append('"')
    return "".join(out)


def parse_go_duration(text: str) -> float:
    """Seconds for `text` exactly as Go's `time.ParseDuration` reads it, errors worded as Go's.

    A bare number other than `0` is an error (`missing unit`), for a flag as for a request's
    `?timeout=` in kube-apiserver. Raises ValueError.
    """
    orig = text.encode()
    s = orig
    neg = False
    if s[:1] in (b"-", b"+"):
        neg = s[:1] == b"-"
        s = s[1:]
    if s == b"0":
        return 0.0
    invalid = ValueError("time: invalid duration " + _time_quote(orig))
    if not s:
        raise invalid
    total = 0
    while s:
        if not (s[:1] == b"." or s[:1].isdigit()):
            raise invalid
        i = 0
        whole = 0
        while i < len(s) and s[i : i + 1].isdigit():
            if whole > _MAX_NS // 10:
                raise invalid  # leadingInt overflow
            whole = whole * 10 + s[i] - 48
            if whole > _MAX_NS:
                raise invalid
            i += 1
        pre = i > 0
        s = s[i:]
        fraction, scale, post = 0, 1.0, False
        if s[:1] == b".":
            s = s[1:]
            i = 0
            overflow = False
            while i < len(s) and s[i : i + 1].isdigit():
                if not overflow:
                    if fraction > (_MAX_NS - 1) // 10:
                        overflow = True
                    else:
                        fraction = fraction * 10 + s[i] - 48
                        scale *= 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            raise invalid
        i = 0
        while i < len(s) and not (s[i : i + 1] == b"." or s[i : i + 1].isdigit()):
            i += 1
        if i == 0:
            raise ValueError("time: missing unit in duration " + _time_quote(orig))
        unit_name, s = s[:i], s[i:]
        unit = _GO_UNITS.get(unit_name)
        if unit is None:
            raise ValueError(f"time: unknown unit {_time_quote(unit_name)} in duration {_time_quote(orig)}")
        if whole > _MAX_NS // unit:
            raise invalid
        value = whole * unit
        if fraction > 0:
            value += int(float(fraction) * (float(unit) / scale))
            if value > _MAX_NS:
                raise invalid
        total += value
        if total > _MAX_NS:
            raise invalid
    if not neg and total > _MAX_NS - 1:
        raise invalid
    return (-total if neg else total) / 1e9
