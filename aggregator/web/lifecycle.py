"""What the pipeline knows about one request from its first moment: computed once, shared by all.

`RequestState` is attached to every request before any gate runs. It holds the one
long-running classification of the request (kube-apiserver's `LongRunningRequestCheck`, which its
max-in-flight, timeout, audit and shutdown filters each call with the same answer), when the
request arrived, and the status line once one goes out. The limits, the deadline, the audit, the
request metrics and graceful shutdown read it; nothing computes the classification twice.

The status line is seen through one hook: `GatewayRequest` calls `ON_RESPONSE_HEAD` just before
any response head is written (a watch's at its start, a plain answer's after the handler
returned), and a tunnel that writes its `101` itself calls `raw_head_sent`. Listeners (the audit's
`ResponseStarted`, its `Audit-Id` header) run then, in the order they were added.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from aggregator.util._aiohttp import ON_RESPONSE_HEAD
from aggregator.web.requestinfo import RequestInfoError, request_info
from aggregator.web.requestlabels import is_long_running

# (request, status code, the response whose head goes out; None for a head written raw, a 101)
HeadListener = Callable[[web.Request, int, web.StreamResponse | None], None]


@dataclass(slots=True, eq=False)
class RequestState:
    received: float  # time.monotonic() when the pipeline got the request
    long_running: bool
    listeners: Sequence[HeadListener] = ()
    # The response whose head went out (a streamed answer, prepared by the handler itself).
    response: web.StreamResponse | None = None
    # The code of the first status line written, None while nothing has been.
    status: int | None = None
    # Set by the last gate: every gate let the request through and its handler runs.
    handled: bool = False
    # Set by a handler upstream wraps in `metrics.InstrumentHandlerFunc` with fixed labels
    # (aggregated discovery, OpenAPI v3): the (subresource, component) it is counted under.
    instrumented_as: tuple[str, str] | None = None

    def head_going_out(self, request: web.Request, status: int, response: web.StreamResponse | None) -> None:
        if self.status is not None:
            return
        self.status = status
        self.response = response
        for listener in self.listeners:
            listener(request, status, response)


STATE = web.RequestKey("aggregator.request_state", RequestState)


def long_running(request: web.Request) -> bool:
    """kube-apiserver's check (`requestlabels.is_long_running`); a path RequestInfo cannot be built
    for is not long-running (authorization answers it with a 500)."""
    try:
        return is_long_running(request_info(request))
    except RequestInfoError:
        return False


def begin(request: web.Request, listeners: Sequence[HeadListener] = ()) -> RequestState:
    """Attach the request's state; called once, by the pipeline, before any gate."""
    state = RequestState(time.monotonic(), long_running(request), listeners)
    request[STATE] = state
    request[ON_RESPONSE_HEAD] = lambda response: state.head_going_out(request, response.status, response)
    return state


def get_state(request: web.Request) -> RequestState | None:
    return request.get(STATE)


def is_long_running_request(request: web.Request) -> bool:
    """Whether the pipeline classified `request` as long-running (watches, exec, attach,
    port-forward, proxy, log): exempt from max-in-flight and the request timeout."""
    state = request.get(STATE)
    return state.long_running if state is not None else long_running(request)


def raw_head_sent(request: web.Request, status: int) -> None:
    """A status line written straight to the transport (an upgrade's `101`), for the listeners."""
    state = request.get(STATE)
    if state is not None:
        state.head_going_out(request, status, None)


def instrument_as(request: web.Request, subresource: str, component: str) -> None:
    """Count this request in `apiserver_request_total` as upstream's fixed-label handler wrapper
    does (`InstrumentHandlerFunc("GET", "", "", "", subresource, "", component)`)."""
    state = request.get(STATE)
    if state is not None:
        state.instrumented_as = (subresource, component)
