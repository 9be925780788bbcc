"""The request pipeline: build the request's context, run the gates, serve, count, log.

`handle` is the one entry of every request, whichever protocol carried it (`web/http1/`,
`web/http2/` hand it a `ServerRequest`). It builds the request's `RequestContext` (the decoded
path, the route matched on it, RequestInfo, the long-running verdict: `context.py`), admits it
past the shutdown tracker (`longrunning.py`), arms its deadline when timeouts are configured
(`timeout.py`), then runs the gates: kube-apiserver's filter chain in the order the composition
root gives them (authentication, audit, impersonation, priority and fairness or max-in-flight,
authorization, upgrade refusal...). A gate reads the context and answers the request itself (a
401, a 403) or lets it go on; a gate that needs no I/O answers without an await. The route's
handler answers everything else, with the context. A `Response` a gate or handler returns is
written here; a streamed answer the handler has written itself. Finishers (the max-in-flight
release, the request metrics, the audit) are told of every request's end, in order; then the
request is counted by route kind and code and gets an access-log line when `--access-log` asks
for one. An exception a handler did not expect becomes upstream's 500 Status, logged with its
traceback; a client that went away is not an error.

Only what is switched on is in the chain: without an audit policy there is no audit gate,
without limits no max-in-flight gate, without timeouts no deadline. The gates and finishers are
fixed when the pipeline is built.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass

from prometheus_client import CollectorRegistry

from aggregator.tracing.api import RequestTracer
from aggregator.util.logs import fields
from aggregator.web.accesslog import CLIENT_GONE, AccessLog
from aggregator.web.context import HeadListener, RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Families, Increments
from aggregator.web.responses import status_response
from aggregator.web.routing import Router
from aggregator.web.serverrequest import Answer, Response, ServerRequest
from aggregator.web.timeout import RequestTimeouts

log = logging.getLogger(__name__)

GateAnswer = Response | None
# A stage before the handler: a response stops the request, None lets it go on. A gate that must
# wait (a review) returns an awaitable of either; one that need not wait answers at once.
Gate = Callable[[RequestContext], "GateAnswer | Awaitable[GateAnswer]"]
# Told of a request's end: the answer (None if the client went away first) and the exception a
# handler did not expect, if any.
Finisher = Callable[[RequestContext, Answer | None, BaseException | None], None]

INTERNAL_ERROR = "Internal error occurred: the gateway failed to serve this request"


class PipelineMetrics:
    """`aggregator_requests_total{route, code}`: every request the pipeline answered, by the kind of
    route that served it (kube-apiserver's `apiserver_request_*` are `requestmetrics.py`'s)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Families(registry).counter(
            "aggregator_requests", "Requests served, by route kind and HTTP code.", ["route", "code"]
        )


@dataclass(eq=False)
class Pipeline:
    """Every request from its context to its answer: the gates in order, the handler, the
    finishers; fixed once built."""

    router: Router
    # `aggregator_requests_total{route, code}`, one child per (route kind, code).
    requests: Increments
    access_log: AccessLog
    _: KW_ONLY
    in_flight: InFlight
    timeouts: RequestTimeouts | None = None
    gates: tuple[Gate, ...] = ()
    head_listeners: tuple[HeadListener, ...] = ()
    finishers: tuple[Finisher, ...] = ()
    # Tracing hook (`tracing/`): gives each request its span, None when it is not sampled.
    tracer: RequestTracer | None = None

    def context(self, request: ServerRequest) -> RequestContext:
        """The context of a request: its facts, and the route that serves it."""
        ctx = RequestContext(request, self.router.match, time.monotonic(), self.head_listeners)
        if self.tracer is not None:  # tracing hook: the span starts with the context
            ctx.span = self.tracer.begin(ctx)
        return ctx

    async def handle(self, request: ServerRequest) -> Answer | None:
        """Serve one request to the end; returns what it was answered (None: the client went away
        before an answer was written)."""
        ctx = self.context(request)
        in_flight = self.in_flight
        answer: Answer | None = in_flight.enter(ctx)
        if answer is not None:
            return await _sent(ctx, answer)
        error: BaseException | None = None
        gone = False  # the client went away (its stream reset, its connection closed)
        timeouts = self.timeouts
        try:
            if timeouts is not None:
                answer = timeouts.arm(ctx)
                if answer is not None:  # a `?timeout=` that is not a Go duration
                    answer = await _sent(ctx, answer)
                    return answer
            try:
                # The gates, then the handler, awaited here: no coroutine of the pipeline's own
                # between this one and the handler's (each costs its creation and every resume).
                admitted = self._admit(ctx)
                if admitted is None or isinstance(admitted, Response):
                    answer = admitted
                else:
                    answer = await admitted
                if answer is None:
                    answer = await ctx.route.handler(ctx)
                if ctx.timed_out:  # the handler swallowed the deadline's cancellation
                    ctx.task.uncancel()
                if isinstance(answer, Response):  # most answers are streamed by their handler
                    await ctx.request.respond(answer)
            except asyncio.CancelledError:
                # The deadline cancelled the handler (and nothing else did): answer for it.
                if timeouts is None or not ctx.timed_out or ctx.task.uncancel() > 0:
                    raise
                answer = await _sent(ctx, await timeouts.expired(ctx))
            return answer
        except (asyncio.CancelledError, ConnectionResetError):
            gone = True
            raise
        except Exception as exc:
            error = exc
            log.exception("request failed", extra=fields(method=ctx.method, path=ctx.path))
            if ctx.status is None:
                answer = await _sent(ctx, status_response(ctx, 500, INTERNAL_ERROR))
            else:
                ctx.request.abort()  # the head is out: the client must see the answer cut short
            return answer
        finally:
            if ctx.deadline is not None and timeouts is not None:
                timeouts.disarm(ctx)
            for finisher in self.finishers:
                finisher(ctx, answer, error)
            code = CLIENT_GONE if gone or ctx.status is None else ctx.status
            self.requests(ctx.route.kind, code)(1)
            self.access_log.record(ctx, code)
            in_flight.leave(ctx)

    def _admit(self, ctx: RequestContext) -> GateAnswer | Awaitable[GateAnswer]:
        """The gates in order: the first answer, None when every gate let the request through, or,
        from the first gate that must wait, an awaitable of either (the later gates run after it)."""
        gates = self.gates
        for index, gate in enumerate(gates):
            answer = gate(ctx)
            if answer is None:
                continue
            if isinstance(answer, Response):
                return answer
            return self._admit_after(ctx, answer, gates[index + 1 :])
        return None

    async def _admit_after(
        self, ctx: RequestContext, waiting: Awaitable[GateAnswer], gates: tuple[Gate, ...]
    ) -> GateAnswer:
        answer = await waiting
        if answer is not None:
            return answer
        for gate in gates:
            told = gate(ctx)
            if told is None:
                continue
            answer = told if isinstance(told, Response) else await told
            if answer is not None:
                return answer
        return None


async def _sent(ctx: RequestContext, answer: Answer) -> Answer:
    """`answer`, written to the client if it is a whole `Response` not yet sent."""
    if isinstance(answer, Response):
        await ctx.request.respond(answer)
    return answer
