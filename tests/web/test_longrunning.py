"""Requests in flight at shutdown: ordinary ones drain, long-running ones are ended, late ones refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

from aggregator.web.context import RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.serverrequest import Response
from tests.support.contexts import context_for
from tests.support.polling import until

Handler = Callable[[RequestContext], Awaitable[Response]]


def tracked(in_flight: InFlight, handler: Handler) -> Callable[[str], Awaitable[Response]]:
    """What the pipeline does around a request: `enter` (or the refusal), the handler, `leave`."""

    async def handle(target: str) -> Response:
        ctx = context_for("GET", target)
        refusal = in_flight.enter(ctx)
        if refusal is not None:
            return refusal
        try:
            return await handler(ctx)
        finally:
            in_flight.leave(ctx)

    return handle


async def test_requests_after_stop_accepting_get_503_retry_after_except_health_paths() -> None:
    in_flight = InFlight()
    served: list[str] = []

    async def handler(ctx: RequestContext) -> Response:
        served.append(ctx.path)
        return Response(200, b"ok")

    handle = tracked(in_flight, handler)
    assert (await handle("/apis")).status == 200
    in_flight.stop_accepting()
    for path in ("/apis/g/v/things", "/apis/g/v/things?watch=true"):
        refused = await handle(path)
        assert isinstance(refused, Response)
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        assert refused.close
        assert isinstance(refused.body, bytes)
        body = json.loads(refused.body)
        assert (body["reason"], body["message"]) == ("ServiceUnavailable", "apiserver is shutting down")
    # Probes and scrapes are still answered (with_retry_after.go's exempt prefixes).
    for path in ("/readyz", "/livez", "/healthz/ping", "/metrics"):
        assert (await handle(path)).status == 200
    assert served == ["/apis", "/readyz", "/livez", "/healthz/ping", "/metrics"]


async def test_drain_waits_for_ordinary_requests_up_to_its_bound() -> None:
    in_flight = InFlight()
    release = asyncio.Event()

    async def slow(_ctx: RequestContext) -> Response:
        await release.wait()
        return Response(200, b"done")

    handle = tracked(in_flight, slow)
    first = asyncio.ensure_future(handle("/apis/g/v/things"))
    await until(lambda: in_flight.ordinary == 1)
    in_flight.stop_accepting()
    assert await in_flight.drain(0.05) == 1  # still running when the bound is over
    draining = asyncio.ensure_future(in_flight.drain(30))
    release.set()
    assert await draining == 0
    assert (await first).status == 200


async def test_end_long_running_interrupts_only_the_marked_streams() -> None:
    in_flight = InFlight()
    endings: dict[str, bool] = {}
    never = asyncio.Event()

    async def stream(ctx: RequestContext) -> Response:
        # As the forwarder relays: only a long-running answer can be ended.
        ended = False
        if ctx.long_running:
            async with in_flight.ending() as ending:
                await never.wait()
            ended = ending.ended
        else:
            await never.wait()
        endings[ctx.target] = ended
        return Response(200, b"ended")

    handle = tracked(in_flight, stream)
    watches = [asyncio.ensure_future(handle(f"/apis/g/v/things?watch=true&n={n}")) for n in range(3)]
    ordinary = asyncio.ensure_future(handle("/apis/g/v/things"))
    await until(lambda: in_flight.long_running == 3 and in_flight.ordinary == 1)

    in_flight.stop_accepting()
    assert await in_flight.end_long_running(10) == 0
    assert all(endings[f"/apis/g/v/things?watch=true&n={n}"] for n in range(3))
    assert [w.result().status for w in watches] == [200, 200, 200]
    # An ordinary request is drained, never interrupted.
    assert not ordinary.done()
    never.set()
    assert (await ordinary).status == 200 and endings["/apis/g/v/things"] is False


async def test_a_stream_reached_after_the_end_began_ends_at_once() -> None:
    in_flight = InFlight()
    assert await in_flight.end_long_running(0) == 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10), in_flight.ending() as ending:  # a tunnel still being dialed
            await asyncio.Event().wait()
    assert ending.ended
