"""Requests in flight, for graceful termination: ordinary ones drain, long-running ones are ended.

kube-apiserver's shutdown (k8s.io/apiserver pkg/server/genericapiserver.go
`preparedGenericAPIServer.RunWithContext`) tracks two kinds of request once it stops accepting
new ones:

- non-long-running requests are counted (filters/waitgroup.go `WithWaitGroup`) and waited for,
  bounded by the request timeout; one that still arrives on an open connection gets 503
  `apiserver is shutting down` with `Retry-After: 1`, except the health and metrics paths
  (filters/with_retry_after.go `isRequestExemptFromRetryAfter`);
- watches return at once (endpoints/handlers/watch.go `serveWatch` on `ServerShuttingDownCh`) and
  their responses complete at no less than 200 per second, faster when there are more than the
  grace period allows (filters/watch_termination.go, `WatchRequestWaitGroup.Wait`), so every one
  has ended when `--shutdown-watch-termination-grace-period` is over.

Here a long-running request is what the request's context says is one (`context.is_long_running`:
upstream's `BasicLongRunningRequestCheck`, plus every upgrade). Its relay opens `ending(ctx)` around the
part that streams: ending it interrupts that part only (an `asyncio.Timeout` rescheduled to now),
so the relay still closes the stream properly (a watch with its last chunk, a tunnel on both
sides) and client-go reconnects elsewhere. Deviation: upstream does not end watches at all when
the grace period is 0 (they die with the process); here they are all ended at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aggregator.web.context import ContextKey, RequestContext
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Response

SHUTTING_DOWN = "apiserver is shutting down"
# genericapiserver.go: watches are ended at this rate at least ("hard coded to 200").
MIN_END_RATE = 200.0
# How long ended responses get to finish when the grace period is 0 (their last bytes, a TLS close).
ENDED_WAIT = 1.0
# with_retry_after.go `pathPrefixesExemptFromRetryAfter`: always served, never counted.
EXEMPT_PREFIXES = ("/readyz", "/livez", "/healthz", "/metrics")
# Whether the shutdown tracker counted the request in (it gives its place back at the end).
TRACKED = ContextKey[bool]("tracked")


class Ending:
    """One long-running response's stop switch: `ended` tells its relay why its stream stopped."""

    __slots__ = ("_scope", "ended")

    def __init__(self) -> None:
        self.ended = False
        self._scope: asyncio.Timeout | None = None

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        scope = self._scope
        if scope is not None and not scope.expired():
            with contextlib.suppress(RuntimeError):  # the scope has just been left
                scope.reschedule(asyncio.get_running_loop().time())


class InFlight:
    """What the server is serving now, and the switches that end it (see the module docstring)."""

    def __init__(self) -> None:
        self.accepting = True
        self._ordinary = 0
        self._long_running = 0
        self._endings: set[Ending] = set()
        self._ending_all = False
        # Set whenever a count drops while shutting down (only then: nothing waits before).
        self._changed = asyncio.Event()

    @property
    def ordinary(self) -> int:
        return self._ordinary

    @property
    def long_running(self) -> int:
        return self._long_running

    def enter(self, ctx: RequestContext) -> Response | None:
        """Count the request in (ordinary or long-running); once `stop_accepting` was called, a new
        request gets upstream's 503 instead. The health and metrics paths are never counted."""
        if ctx.path.startswith(EXEMPT_PREFIXES):
            return None
        if not self.accepting:
            return refuse(ctx)
        TRACKED.set(ctx, True)
        if ctx.long_running:
            self._long_running += 1
        else:
            self._ordinary += 1
        return None

    def leave(self, ctx: RequestContext) -> None:
        """The request `enter` counted is over."""
        if not TRACKED.get(ctx):
            return
        if ctx.long_running:
            self._long_running -= 1
        else:
            self._ordinary -= 1
        if not self.accepting:
            self._changed.set()

    @contextlib.asynccontextmanager
    async def ending(self) -> AsyncIterator[Ending]:
        """Run the block (a long-running answer's stream, a tunnel) until it finishes or shutdown
        ends it (`Ending.ended`, no exception). Ordinary requests never open one: they drain."""
        ending = Ending()
        self._endings.add(ending)
        try:
            async with asyncio.timeout(None) as scope:
                ending._scope = scope
                if self._ending_all:  # admitted before shutdown, reached its stream after
                    ending.end()
                yield ending
        except TimeoutError:
            if not ending.ended:
                raise
        finally:
            self._endings.discard(ending)
            self._changed.set()

    def stop_accepting(self) -> None:
        """NotAcceptingNewRequest: from now on every new request is refused."""
        self.accepting = False

    async def drain(self, timeout: float) -> int:  # noqa: ASYNC109 - the bound is the point
        """Wait up to `timeout` seconds for ordinary requests to finish; returns how many did not."""
        await self._wait(lambda: self._ordinary == 0, timeout)
        return self._ordinary

    async def end_long_running(self, grace: float) -> int:
        """End every long-running response, all within `grace` seconds (at once when it is 0), and
        wait for them as long; returns how many are still running."""
        self._ending_all = True
        endings = list(self._endings)
        interval = 0.0
        if grace > 0 and endings:
            interval = 1 / max(MIN_END_RATE, len(endings) / grace)
        for ending in endings:
            ending.end()
            if interval:
                await asyncio.sleep(interval)
        await self._wait(lambda: not self._endings and self._long_running == 0, max(grace, ENDED_WAIT))
        return self._long_running

    async def _wait(self, done: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()


def refuse(ctx: RequestContext) -> Response:
    """filters/waitgroup.go `waitGroupWriteRetryAfterToResponse`, and the connection closes."""
    response = status_response(ctx, 503, SHUTTING_DOWN, headers={"Retry-After": "1"})
    response.force_close()
    return response
