"""Accept-header negotiation as apiserver does it (munnerz/goautoneg + `NegotiateMediaTypeOptions`).

Clauses are sorted with goautoneg's non-strict comparison (Go's insertion sort for short lists),
then the first clause this server can produce wins. `as`/`g`/`v` parameters ask for a
transformation (Table, aggregated discovery); unknown parameters are ignored; q=0 still matches.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Clause:
    type: str
    subtype: str
    q: float
    params: dict[str, str] = field(default_factory=dict)

    @property
    def media_type(self) -> str:
        return f"{self.type}/{self.subtype}"

    @property
    def convert(self) -> tuple[str, str, str] | None:
        """(group, version, kind) when the clause asks for a transformed object."""
        kind = self.params.get("as", "")
        if not kind:
            return None
        return (self.params.get("g", ""), self.params.get("v", ""), kind)


def _float32(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return float(struct.unpack("f", struct.pack("f", value))[0])


def parse_accept(header: str) -> list[Clause]:
    clauses: list[Clause] = []
    for part in header.split(","):
        pieces = [p.strip(" ") for p in part.split(";")]
        media = pieces[0]
        if media == "*":
            media = "*/*"
        halves = media.split("/")
        if len(halves) != 2 or not halves[0] or not halves[1]:
            continue
        q = 1.0
        params: dict[str, str] = {}
        for piece in pieces[1:]:
            kv = piece.split("=")
            if len(kv) != 2:
                continue
            key, value = kv[0].strip(" "), kv[1].strip(" ")
            if key == "q":
                q = _float32(value)
            else:
                params[key] = value
        clauses.append(Clause(halves[0], halves[1], q, params))

    def less(a: Clause, b: Clause) -> bool:
        return a.q > b.q or (a.type != "*" and b.type == "*") or (a.subtype != "*" and b.subtype == "*")

    for i in range(1, len(clauses)):
        j = i
        while j > 0 and less(clauses[j], clauses[j - 1]):
            clauses[j], clauses[j - 1] = clauses[j - 1], clauses[j]
            j -= 1
    return clauses


def matches(clause: Clause, media_type: str) -> bool:
    kind, _, sub = media_type.partition("/")
    return (clause.type in ("*", kind)) and (clause.subtype in ("*", sub))


@dataclass(frozen=True)
class Negotiated:
    media_type: str  # application/json or application/yaml
    convert: tuple[str, str, str] | None  # requested transformation, if any
    params: dict[str, str]


def negotiate(
    header: str,
    supported: tuple[str, ...],
    allowed_conversions: frozenset[tuple[str, str, str]] = frozenset(),
    *,
    conversions_only: bool = False,
) -> Negotiated | None:
    """The first acceptable clause, or None (406).

    With `conversions_only`, clauses without a transformation are skipped (aggregated discovery's
    `DiscoveryEndpointRestrictions`). Empty Accept means the first supported type.
    """
    clauses = parse_accept(header) if header.strip() else []
    if not clauses:
        return None if conversions_only else Negotiated(supported[0], None, {})
    for clause in clauses:
        stream = clause.params.get("stream", "")
        if stream and stream != "watch":
            continue
        if clause.params.get("sv"):
            continue
        convert = clause.convert
        if convert is not None and convert not in allowed_conversions:
            continue
        if conversions_only and convert is None:
            continue
        for media in supported:
            if matches(clause, media):
                return Negotiated(media, convert, clause.params)
    return None
