"""Accept negotiation for the sample server: the gateway's goautoneg port with this server's rules.

Which transformations a response may take (`as=Table`, PartialObjectMetadata, aggregated
discovery) is the only thing that differs per endpoint, exactly as apiserver's
`EndpointRestrictions` does it; parsing and matching are shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.wire.negotiation import GVK, parse_accept
from aggregator.wire.negotiation import negotiate as negotiate_clauses

__all__ = ["Negotiated", "negotiate", "parse_accept"]

Conversion = tuple[str, str, str]  # (group, version, kind)


@dataclass(frozen=True)
class Negotiated:
    media_type: str
    convert: Conversion | None  # requested transformation, if any


def negotiate(
    header: str,
    supported: tuple[str, ...],
    allowed_conversions: frozenset[Conversion] = frozenset(),
    *,
    conversions_only: bool = False,
) -> Negotiated | None:
    """The first acceptable clause, or None (406).

    With `conversions_only`, clauses without a transformation are skipped (aggregated discovery's
    `DiscoveryEndpointRestrictions`). Empty Accept means the first supported type.
    """
    if not header.strip():
        return None if conversions_only else Negotiated(supported[0], None)

    def restriction(_media_type: str, convert: GVK | None) -> bool:
        if convert is None:
            return not conversions_only
        return (convert.group, convert.version, convert.kind) in allowed_conversions

    chosen = negotiate_clauses(parse_accept(header), restriction, supported)
    if chosen is None:
        return None
    convert = chosen.convert
    return Negotiated(
        chosen.media_type, None if convert is None else (convert.group, convert.version, convert.kind)
    )
