"""The router: exact paths, then dynamic claims in order, then the longest prefix, then the fallback."""

from __future__ import annotations

from aggregator.web.context import RequestContext
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.serverrequest import Response


async def _never(ctx: RequestContext) -> Response:
    raise AssertionError("not called")


def route(name: str) -> Route:
    return Route(_never, RouteKind.OWN, name)


def test_exact_then_claims_then_longest_prefix_then_fallback() -> None:
    router = Router(route("fallback"))
    router.add_prefix("/apis/", route("apis-prefix"))
    router.add_prefix("/apis/a.example.com/", route("group-prefix"))
    router.add_exact("/apis", route("apis"))
    router.add_claim(lambda path: route("claimed") if path.startswith("/apis/b.example.com/") else None)

    assert router.match("/apis").name == "apis"
    assert router.match("/apis/b.example.com/v1").name == "claimed"
    assert router.match("/apis/a.example.com/v1").name == "group-prefix"  # the longer prefix wins
    assert router.match("/apis/c.example.com").name == "apis-prefix"
    assert router.match("/api/v1").name == "fallback"


def test_claims_are_asked_in_the_order_added() -> None:
    router = Router(route("fallback"))
    asked: list[str] = []

    def first(path: str) -> Route | None:
        asked.append("first")
        return route("first") if path == "/x" else None

    def second(path: str) -> Route | None:
        asked.append("second")
        return route("second")

    router.add_claim(first)
    router.add_claim(second)
    assert router.match("/x").name == "first" and asked == ["first"]
    assert router.match("/y").name == "second" and asked == ["first", "first", "second"]


def test_an_exact_path_is_not_a_prefix() -> None:
    router = Router(route("fallback"))
    router.add_exact("/metrics", route("metrics"))
    assert router.match("/metrics/").name == "fallback"
    assert router.match("/metricsx").name == "fallback"


def test_the_fallback_can_be_replaced() -> None:
    router = Router(route("not-found"))
    router.fallback = route("delegate")
    assert router.match("/anything").name == "delegate"
