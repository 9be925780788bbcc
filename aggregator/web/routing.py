"""Which component answers a path.

Like upstream's path recorder: exact paths first, then the dynamic claims (the APIService table:
group and group-version paths), then registered prefixes, then the fallback (kube-apiserver in
kube mode, a 404 Status in local mode). Matching is dictionary lookups and a short prefix scan on
the request's decoded path (`RequestContext.path`, Go's `URL.Path`): it runs for every request
before authentication, so it must stay cheap.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.web.context import Handler, Route, RouteKind

__all__ = ["Handler", "PathClaim", "Route", "RouteKind", "Router"]

# Claims a dynamic path (the APIService table), or returns None to let the next rule decide.
PathClaim = Callable[[str], Route | None]


class Router:
    def __init__(self, fallback: Route) -> None:
        self.fallback = fallback
        self._exact: dict[str, Route] = {}
        self._prefixes: list[tuple[str, Route]] = []
        self._claims: list[PathClaim] = []

    def add_exact(self, path: str, route: Route) -> None:
        self._exact[path] = route

    def add_prefix(self, prefix: str, route: Route) -> None:
        """`prefix` should end with `/`; longer prefixes win."""
        self._prefixes.append((prefix, route))
        self._prefixes.sort(key=lambda item: (item[0].count("/"), len(item[0])), reverse=True)

    def add_claim(self, claim: PathClaim) -> None:
        """Consulted in the order added, after exact paths and before prefixes."""
        self._claims.append(claim)

    def match(self, path: str) -> Route:
        route = self._exact.get(path)
        if route is not None:
            return route
        for claim in self._claims:
            route = claim(path)
            if route is not None:
                return route
        for prefix, route in self._prefixes:
            if path.startswith(prefix):
                return route
        return self.fallback
