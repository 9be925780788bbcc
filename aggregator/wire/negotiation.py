"""Content negotiation exactly as kube-apiserver does it: goautoneg `ParseAccept` + `NegotiateMediaTypeOptions`.

The quirks are the point: clauses are split on `,` and `;` without any quoting rules, `q` is a
float32 (`0.9` is 0.8999999761581421), the sort's `Less` is not a strict order (so `text/*,
application/json;q=0.9` puts JSON first), `q=0` still matches, and types compare case-sensitively.
Endpoints restrict which clauses may match: legacy discovery refuses any clause asking for a
conversion (`g`/`v`/`as`); the aggregated wrapper's first pass accepts only the aggregated-discovery
conversion, so plain clauses are skipped there.

We serve JSON and YAML. Protobuf is listed in the 406 message (clients read it as upstream's) but never
chosen, so a client that prefers protobuf and also accepts JSON gets JSON.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.model.status import status_body
from aggregator.wire.gosort import go_sort
from aggregator.wire.jsonenc import go_marshal_indent

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"

# Upstream's order; the first one is the default for an empty Accept header.
SERVED_TYPES: tuple[str, ...] = (JSON, YAML)
# What the 406 message lists: kube-apiserver's serializers, so clients see upstream's exact text.
ADVERTISED_TYPES: tuple[str, ...] = (JSON, YAML, PROTOBUF)
NOT_ACCEPTABLE_MESSAGE = "only the following media types are accepted: " + ", ".join(ADVERTISED_TYPES)

DISCOVERY_GROUP = "apidiscovery.k8s.io"
DISCOVERY_KIND = "APIGroupDiscoveryList"
# v2beta1 is served too (upstream stopped in 1.33), so older kubectl still discovers in one request.
DISCOVERY_VERSIONS = ("v2", "v2beta1")


@dataclass(frozen=True, slots=True)
class Clause:
    """One Accept clause after goautoneg parsing."""

    type: str
    subtype: str
    q: float = 1.0
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GVK:
    group: str
    version: str
    kind: str


@dataclass(frozen=True, slots=True)
class MediaType:
    """`MediaTypeOptions`: the serializer chosen and what the clause asked of it."""

    media_type: str
    convert: GVK | None = None
    pretty: bool = False
    stream: str = ""
    profile: str = ""

    @property
    def aggregated_version(self) -> str | None:
        """`v2`/`v2beta1` when the clause asked for the aggregated discovery document."""
        convert = self.convert
        return convert.version if convert is not None and is_aggregated_discovery(convert) else None


def is_aggregated_discovery(gvk: GVK | None) -> bool:
    return (
        gvk is not None
        and gvk.group == DISCOVERY_GROUP
        and gvk.kind == DISCOVERY_KIND
        and gvk.version in DISCOVERY_VERSIONS
    )


# --- ParseFloat(s, 32) ----------------------------------------------------------------------------

_GO_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_GO_HEX = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+")
_GO_INF = re.compile(r"[+-]?(?:inf|infinity)", re.IGNORECASE)


def parse_float32(text: str) -> float:
    """`strconv.ParseFloat(text, 32)` with the error ignored: 0 on bad syntax, ±Inf past float32's range.

    Go rounds the decimal straight to float32; we round through float64 first, which differs only for
    decimals within 2**-53 of a float32 rounding midpoint (no real `q` value is).
    """
    if _GO_DECIMAL.fullmatch(text):
        value = float(text)
    elif _GO_HEX.fullmatch(text):
        try:
            value = float.fromhex(text)
        except OverflowError:
            return -math.inf if text.startswith("-") else math.inf
    elif _GO_INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    elif text.lower() == "nan":
        return math.nan
    else:
        return 0.0
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


# --- goautoneg.ParseAccept -------------------------------------------------------------------------


def _clause_less(a: Clause, b: Clause) -> bool:
    if a.q > b.q:
        return True
    if a.type != "*" and b.type == "*":
        return True
    return a.subtype != "*" and b.subtype == "*"


def parse_accept(header: str) -> list[Clause]:
    """goautoneg `ParseAccept`: clauses in the order negotiation tries them."""
    clauses: list[Clause] = []
    for raw_part in header.split(","):
        part = raw_part.strip(" ")
        pieces = part.split(";")
        media_range = pieces[0].split("/")
        type_ = media_range[0].strip(" ")
        if len(media_range) == 1 and type_ == "*":
            subtype = "*"
        elif len(media_range) == 2:
            subtype = media_range[1].strip(" ")
        else:
            continue
        q = 1.0
        params: dict[str, str] = {}
        for param in pieces[1:]:
            key, sep, value = param.partition("=")
            if not sep:
                continue
            token = key.strip(" ")
            if token == "q":
                q = parse_float32(value)  # not trimmed: `q= 0.5` is a syntax error, so 0
            else:
                params[token] = value.strip(" ")
        clauses.append(Clause(type_, subtype, q, params))
    go_sort(clauses, _clause_less)
    return clauses


# --- NegotiateMediaTypeOptions ---------------------------------------------------------------------

# AllowsMediaTypeTransform(convert) for an endpoint; streams (`stream=watch`) are allowed everywhere.
Restriction = Callable[[str, GVK | None], bool]


def default_restriction(_media_type: str, convert: GVK | None) -> bool:
    """`DefaultEndpointRestrictions`: no conversions at all (legacy discovery, APIGroup)."""
    return convert is None


def discovery_restriction(_media_type: str, convert: GVK | None) -> bool:
    """`DiscoveryEndpointRestrictions`: only the aggregated discovery conversion."""
    return is_aggregated_discovery(convert)


_STREAMING = frozenset({JSON, PROTOBUF})


def _accept_options(params: dict[str, str], media_type: str, restriction: Restriction) -> MediaType | None:
    group = version = kind = None
    pretty = False
    stream = profile = ""
    for key, value in params.items():
        if key == "as":
            kind = value
        elif key == "g":
            group = value
        elif key == "v":
            version = value
        elif key == "stream":
            if value and (media_type not in _STREAMING or value != "watch"):
                return None
            stream = value
        elif key == "sv":
            if value:
                return None
        elif key == "pretty":
            pretty = value == "1"
        elif key == "profile":
            profile = value
    convert = None
    if group is not None or version is not None or kind is not None:
        convert = GVK(group or "", version or "", kind or "")
    if not restriction(media_type, convert):
        return None
    return MediaType(media_type, convert, pretty, stream, profile)


def negotiate(
    clauses: list[Clause], restriction: Restriction, served: tuple[str, ...] = SERVED_TYPES
) -> MediaType | None:
    """The first (clause, served type) pair that matches and the endpoint allows; None means 406."""
    for clause in clauses:
        for media_type in served:
            type_, _, subtype = media_type.partition("/")
            if (clause.type == type_ and clause.subtype in (subtype, "*")) or (
                clause.type == "*" and clause.subtype == "*"
            ):
                chosen = _accept_options(clause.params, media_type, restriction)
                if chosen is not None:
                    return chosen
    return None


class Negotiator:
    """Negotiation results per distinct Accept header, cached: clients send the same few headers."""

    def __init__(self, restriction: Restriction, *, served: tuple[str, ...] = SERVED_TYPES, size: int = 512):
        self._restriction = restriction
        self._served = served
        self._size = size
        self._cache: dict[str, MediaType | None] = {}

    def __call__(self, accept: str) -> MediaType | None:
        try:
            return self._cache[accept]
        except KeyError:
            pass
        if not accept:
            result: MediaType | None = MediaType(self._served[0])
        else:
            result = negotiate(parse_accept(accept), self._restriction, self._served)
        if len(self._cache) >= self._size:
            # Drop the oldest entry (dicts keep insertion order): a bounded cache against header spraying.
            del self._cache[next(iter(self._cache))]
        self._cache[accept] = result
        return result


def not_acceptable_body() -> bytes:
    """Upstream's 406 body: `json.MarshalIndent` of the Status, two-space indent, no trailing newline."""
    return go_marshal_indent(status_body(406, NOT_ACCEPTABLE_MESSAGE))
