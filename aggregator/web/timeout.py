"""`--request-timeout`, a request's `?timeout=`, and `--min-request-timeout` for watches.

Non-long-running requests, as kube-apiserver's `WithRequestDeadline`
(pkg/endpoints/filters/request_deadline.go) and `WithTimeoutForNonLongRunningRequests`
(pkg/server/filters/timeout.go): the deadline is the arrival time plus `--request-timeout`, or
plus the request's `?timeout=` when that is shorter and above zero (`parseTimeout`: Go's
`time.ParseDuration`; a bad value is a 400 Status `invalid timeout specified in the request URL -
<Go's error>`). It covers everything after the router: authentication, the reviews, the backend.
At the deadline the handler is cancelled (upstream lets its goroutine run on and discards what
it writes; cancelling also closes the backend connection). If no status line went out, the
answer is upstream's `timeoutWriter.timeout`: 504 and the Timeout Status written by a bare
`json.NewEncoder` (no kind or apiVersion, a trailing newline, and the `text/plain` type Go's
server sniffs for it). If the head had gone out, the connection is closed, as upstream's
`panic(http.ErrAbortHandler)` does, so the client sees a truncated answer, never a complete-looking
one. Either way `apiserver_request_terminations_total{code="504"}` counts it.

Watches, as kube-apiserver's watch handler (pkg/endpoints/handlers/get.go `handleWatch`): a watch
ends after `timeoutSeconds` when the request gives one above zero, otherwise after
`--min-request-timeout` x (1 + rand[0,1)), so watches opened together do not all come back at once.
The gateway applies that to every watch it proxies and ends it cleanly: the chunked answer is
terminated, as upstream's handler returns, and client-go opens a new watch from the last
resourceVersion it saw. (The backend applies its own rule as well; whichever ends first wins.)
Other long-running requests (exec, attach, port-forward, proxy, log) have no deadline, as upstream.

Every deadline is watched by one timer (`DeadlineTimer`), not a timer per request: a request
registers in a set and leaves it when it ends, and the timer only ever fires at the earliest
deadline of the requests still in flight. A request that ends before then costs a set insertion
and a removal; expiry is exact.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable

from aggregator.util.durations import parse_go_duration
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.requestmetrics import APISERVER, RequestMetrics
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Answer, Response

log = logging.getLogger(__name__)

INVALID_TIMEOUT = "invalid timeout specified in the request URL"  # request_deadline.go invalidTimeoutInURL
TIMEOUT_MESSAGE = "Timeout: request did not complete within the allotted timeout"
# apierrors.NewTimeoutError(..., 0) as `json.NewEncoder(w).Encode(&err.ErrStatus)` writes it.
TIMEOUT_BODY = (
    b'{"metadata":{},"status":"Failure","message":"' + TIMEOUT_MESSAGE.encode() + b'",'
    b'"reason":"Timeout","details":{},"code":504}\n'
)
# What Go's server sniffs for that body (no Content-Type is set before it is written).
TIMEOUT_CONTENT_TYPE = "text/plain; charset=utf-8"


def timeout_answer() -> Response:
    return Response(504, TIMEOUT_BODY, content_type=TIMEOUT_CONTENT_TYPE)


def watch_timeout(
    query: dict[str, list[str]], min_request_timeout: float, rand: Callable[[], float]
) -> float | None:
    """`handleWatch`: `timeoutSeconds` if given and not 0, else `minRequestTimeout * (1 + rand)`;
    None when neither applies (no `--min-request-timeout`, or a value the backend will refuse)."""
    values = query.get("timeoutSeconds")
    if values:
        try:
            given = int(values[0])
        except ValueError:
            return None  # the backend answers the bad value with its own 400
        if given > 0:
            return float(given)
        if given < 0:
            return None
    if min_request_timeout > 0:
        return min_request_timeout * (1.0 + rand())
    return None


class DeadlineTimer:
    """One event-loop timer for the deadlines of every request in flight.

    `add` registers a request whose `deadline` is set; `discard` forgets it when it ends. The
    timer is set to the earliest deadline it has seen and, when it fires, expires every request
    whose deadline has passed and sets itself to the earliest deadline left. Requests that end
    before the timer fires were only ever a set member.
    """

    def __init__(self, expire: Callable[[RequestContext], None], clock: Callable[[], float] = time.monotonic):
        self._expire = expire
        self._clock = clock
        self._armed: set[RequestContext] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._fires_at = math.inf

    def __len__(self) -> int:
        return len(self._armed)

    def add(self, ctx: RequestContext) -> None:
        deadline = ctx.deadline
        assert deadline is not None
        self._armed.add(ctx)
        if deadline < self._fires_at:
            self._schedule(deadline)

    def discard(self, ctx: RequestContext) -> None:
        self._armed.discard(ctx)

    def _schedule(self, deadline: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._fires_at = deadline
        delay = max(0.0, deadline - self._clock())
        self._handle = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._fires_at = math.inf
        now = self._clock()
        due = [ctx for ctx in self._armed if ctx.deadline is not None and ctx.deadline <= now]
        for ctx in due:
            self._armed.discard(ctx)
        earliest = min((ctx.deadline for ctx in self._armed if ctx.deadline is not None), default=math.inf)
        if earliest < math.inf:
            self._schedule(earliest)
        for ctx in due:
            self._expire(ctx)


class RequestTimeouts:
    def __init__(
        self,
        metrics: RequestMetrics,
        *,
        request_timeout: float,
        min_request_timeout: float,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.metrics = metrics
        self.request_timeout = request_timeout
        self.min_request_timeout = min_request_timeout
        # The watch's random factor; injectable so tests need not wait half an hour or race.
        self.rand = rand
        self.timer = DeadlineTimer(self._cancel)

    @property
    def enabled(self) -> bool:
        """Whether any request can get a deadline (both flags 0: the pipeline skips this)."""
        return self.request_timeout > 0 or self.min_request_timeout > 0

    def arm(self, ctx: RequestContext) -> Response | None:
        """Give `ctx` its deadline, if it has one; a 400 for a bad `?timeout=`."""
        if ctx.long_running:
            if ctx.info is None or ctx.info.verb != "watch":
                return None
            seconds = watch_timeout(ctx.query, self.min_request_timeout, self.rand)
            if seconds is None:
                return None
            ctx.watch_deadline = True
        else:
            seconds = self.request_timeout
            if "timeout" in ctx.raw_query:
                value = ctx.query_value("timeout")
                if value:
                    try:
                        given = parse_go_duration(value)
                    except ValueError as err:
                        message = f"{INVALID_TIMEOUT} - {err}"
                        log.info(
                            "bad request", extra=fields(method=ctx.method, path=ctx.path, reason=message)
                        )
                        return status_response(ctx, 400, message)
                    if 0 < given < seconds or (seconds == 0 and given > 0):
                        seconds = given
            if seconds <= 0:
                return None  # --request-timeout=0: no deadline (upstream would time out at once)
        ctx.deadline = ctx.received + seconds
        ctx.task = asyncio.current_task()
        self.timer.add(ctx)
        return None

    @staticmethod
    def _seconds(ctx: RequestContext, seconds: float) -> float:
        """`seconds`, or the request's `?timeout=` when shorter and above zero (ValueError: not a
        Go duration)."""
        if "timeout" in ctx.raw_query:
            value = ctx.query_value("timeout")
            if value:
                given = parse_go_duration(value)
                if 0 < given < seconds or (seconds == 0 and given > 0):
                    return given
        return seconds

    def rearm(self, ctx: RequestContext, request_timeout: float) -> None:
        """An APIService's own request timeout replaces --request-timeout for this request (the
        request's shorter `?timeout=` still wins; `arm` already refused one that does not parse)."""
        if ctx.long_running:
            return
        try:
            seconds = self._seconds(ctx, request_timeout)
        except ValueError:
            return
        if ctx.deadline is not None:
            self.timer.discard(ctx)
        ctx.deadline = ctx.received + seconds
        ctx.task = asyncio.current_task()
        self.timer.add(ctx)

    def disarm(self, ctx: RequestContext) -> None:
        self.timer.discard(ctx)

    @staticmethod
    def _cancel(ctx: RequestContext) -> None:
        ctx.timed_out = True
        ctx.task.cancel()

    async def expired(self, ctx: RequestContext) -> Answer:
        """The answer once the deadline passed and the handler was cancelled."""
        started = ctx.request.streamed
        if ctx.watch_deadline and started is not None:
            # The watch's time is up: its stream ends as the backend would have ended it.
            await started.finish()
            return started
        self.metrics.terminated(ctx, 504, component=APISERVER)
        assert ctx.deadline is not None
        timeout = round(ctx.deadline - ctx.received, 3)
        if ctx.status is None:
            log.info("request timed out", extra=fields(method=ctx.method, path=ctx.path, timeout=timeout))
            return timeout_answer()
        log.info(
            "request timed out after its answer started; cutting it short",
            extra=fields(method=ctx.method, path=ctx.path, timeout=timeout),
        )
        ctx.request.abort()
        return started if started is not None else timeout_answer()
