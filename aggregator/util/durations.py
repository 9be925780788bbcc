"""Go-style duration strings (`10s`, `1m30s`, `500ms`), as kube-apiserver's flags take them."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds for a Go duration; a bare number is taken as seconds. Raises ValueError."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total
