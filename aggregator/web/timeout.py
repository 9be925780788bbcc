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
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from aggregator.util.durations import parse_go_duration
from aggregator.util.logs import fields
from aggregator.web.lifecycle import RequestState
from aggregator.web.requestinfo import RequestInfoError, request_info
from aggregator.web.requestmetrics import APISERVER, MonitoredRequest, RequestMetrics
from aggregator.web.responses import status_response
from aggregator.wire.gourl import parse_query

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


@dataclass(frozen=True, slots=True)
class Deadline:
    seconds: float  # from the request's arrival
    watch: bool  # a watch's end (clean), not a request timeout


def timeout_answer() -> web.Response:
    response = web.Response(status=504, body=TIMEOUT_BODY, headers={"Content-Type": TIMEOUT_CONTENT_TYPE})
    return response


def watch_timeout(raw_query: str, min_request_timeout: float, rand: Callable[[], float]) -> float | None:
    """`handleWatch`: `timeoutSeconds` if given and not 0, else `minRequestTimeout * (1 + rand)`;
    None when neither applies (no `--min-request-timeout`, or a value the backend will refuse)."""
    values = parse_query(raw_query).get("timeoutSeconds") if "timeoutSeconds" in raw_query else None
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

    def deadline(self, request: web.Request, state: RequestState) -> Deadline | web.Response | None:
        """The request's deadline, a 400 for a bad `?timeout=`, or None (no deadline)."""
        if state.long_running:
            return self._watch_deadline(request)
        query = request.rel_url.raw_query_string
        timeout = self.request_timeout
        if "timeout" in query:
            values = parse_query(query).get("timeout")
            if values and values[0]:
                try:
                    given = parse_go_duration(values[0])
                except ValueError as err:
                    message = f"{INVALID_TIMEOUT} - {err}"
                    log.info(
                        "bad request", extra=fields(method=request.method, path=request.path, reason=message)
                    )
                    return status_response(request, 400, message)
                if 0 < given < timeout or (timeout == 0 and given > 0):
                    timeout = given
        if timeout <= 0:
            return None  # --request-timeout=0: no deadline (upstream would time out at once)
        return Deadline(timeout, watch=False)

    def _watch_deadline(self, request: web.Request) -> Deadline | None:
        try:
            watch = request_info(request).verb == "watch"
        except RequestInfoError:
            return None
        if not watch:
            return None
        seconds = watch_timeout(request.rel_url.raw_query_string, self.min_request_timeout, self.rand)
        return Deadline(seconds, watch=True) if seconds is not None else None

    def remaining(self, deadline: Deadline, state: RequestState) -> float:
        return deadline.seconds - (time.monotonic() - state.received)

    def expired(self, request: web.Request, state: RequestState, deadline: Deadline) -> web.StreamResponse:
        """The answer once the deadline passed and the handler was cancelled."""
        started = state.response
        if deadline.watch and started is not None:
            # The watch's time is up: the pipeline returns the streamed answer, which terminates it.
            return started
        self.metrics.terminated(MonitoredRequest.of(request), 504, component=APISERVER)
        if state.status is None:
            log.info(
                "request timed out",
                extra=fields(method=request.method, path=request.path, timeout=round(deadline.seconds, 3)),
            )
            return timeout_answer()
        log.info(
            "request timed out after its answer started; closing the connection",
            extra=fields(method=request.method, path=request.path, timeout=round(deadline.seconds, 3)),
        )
        if request.transport is not None:
            request.transport.close()
        return started if started is not None else timeout_answer()
