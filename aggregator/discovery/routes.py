"""Where discovery plugs into the gateway's router: `/apis`, `/apis/`, `/apis/<group>`, `/apis/<group>/`.

`/apis` is the wrapped handler upstream: the aggregated document when the Accept header asks for it
(plain clauses skipped in that first pass), else the legacy APIGroupList. `/apis/` is legacy only.
The group paths are claimed only for registered groups, and only in those two shapes:
`/apis/<group>/<version>/...` belongs to the proxy.
"""

from __future__ import annotations

from typing import Protocol

from aggregator.discovery.legacy import LegacyDiscovery
from aggregator.web.context import RequestContext
from aggregator.web.instrumentation import instrument_as
from aggregator.web.requestmetrics import APISERVER
from aggregator.web.routing import Handler, Route, RouteKind, Router
from aggregator.web.serverrequest import Answer, Response
from aggregator.wire.negotiation import MediaType, Negotiator, discovery_restriction

ROUTE_NAME = "discovery"


class AggregatedEndpoint(Protocol):
    """What `/apis` needs from the aggregated document."""

    def serve_aggregated(self, ctx: RequestContext, media: MediaType) -> Response | None:
        """The aggregated document in `media`; None while `/apis` serves the legacy document only
        (a kube-apiserver without aggregated discovery)."""
        ...


class DiscoveryRoutes:
    def __init__(
        self, legacy: LegacyDiscovery, aggregated: AggregatedEndpoint | None, fallback: Handler
    ) -> None:
        self.legacy = legacy
        # None: `/apis` serves the legacy document only.
        self.aggregated = aggregated
        self.fallback = fallback
        self._aggregated_negotiator = Negotiator(discovery_restriction)
        self.apis_route = Route(self.serve_apis, RouteKind.OWN, ROUTE_NAME)
        self.legacy_route = Route(self.serve_legacy_apis, RouteKind.OWN, ROUTE_NAME)
        self.group_route = Route(self.serve_group, RouteKind.OWN, ROUTE_NAME)

    def install(self, router: Router) -> None:
        router.add_exact("/apis", self.apis_route)
        router.add_exact("/apis/", self.legacy_route)
        router.add_claim(self.claim)

    def claim(self, path: str) -> Route | None:
        """Claims `/apis/<group>` and `/apis/<group>/` for registered groups only."""
        group = group_of_path(path)
        if group is not None and self.legacy.has_group(group):
            return self.group_route
        return None

    async def serve_apis(self, ctx: RequestContext) -> Response:
        if self.aggregated is not None:
            media = self._aggregated_negotiator(ctx.headers.get("Accept", ""))
            if media is not None and media.aggregated_version is not None:
                response = self.aggregated.serve_aggregated(ctx, media)
                if response is not None:
                    # aggregated.NewResourceManager("apis") instruments only the aggregated document
                    instrument_as(ctx, "apis", APISERVER)
                    return response
        return self.legacy.serve_group_list(ctx)

    async def serve_legacy_apis(self, ctx: RequestContext) -> Response:
        return self.legacy.serve_group_list(ctx)

    async def serve_group(self, ctx: RequestContext) -> Answer:
        group = group_of_path(ctx.path)
        response = self.legacy.serve_group(ctx, group) if group is not None else None
        if response is None:
            # The group went away while the request was being authorized: answer as for any unknown path.
            return await self.fallback(ctx)
        return response


def group_of_path(path: str) -> str | None:
    """`/apis/<group>` or `/apis/<group>/` -> group; anything else -> None."""
    if not path.startswith("/apis/"):
        return None
    rest = path[6:]
    if rest.endswith("/"):
        rest = rest[:-1]
    if not rest or "/" in rest:
        return None
    return rest
