"""JSON bytes exactly as Go's encoding/json writes them.

Clients compare our documents with kube-apiserver's (and the aggregated-discovery ETag is a hash of
the bytes), so key order, separators, HTML escaping and the trailing newline must match Go.
"""

from __future__ import annotations

import json
from typing import Any

_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _go_escape(text: str) -> str:
    # These characters can only occur inside JSON strings, so a plain translation is safe.
    return text.translate(_GO_ESCAPES)


def go_marshal(obj: Any) -> bytes:
    """`json.Marshal(obj)`: compact, HTML-escaped, no trailing newline."""
    return _go_escape(json.dumps(obj, separators=(",", ":"), ensure_ascii=False)).encode()


def go_marshal_indent(obj: Any) -> bytes:
    """`json.MarshalIndent(obj, "", "  ")`, no trailing newline."""
    return _go_escape(json.dumps(obj, indent=2, ensure_ascii=False)).encode()


def encode_object(obj: Any, *, pretty: bool = False) -> bytes:
    """What the apimachinery JSON serializer writes for an API object.

    Compact output goes through `json.Encoder.Encode`, which appends `\n`; the pretty path is
    `json.MarshalIndent` written as is, without one.
    """
    return go_marshal_indent(obj) if pretty else go_marshal(obj) + b"\n"
