"""The request pipeline: build the request's context, run the gates, serve, count, log.

`handle` is the one entry of HTTP/1.1 requests (aiohttp's low-level server calls it). It builds
the request's `RequestContext` (route, RequestInfo, the long-running verdict: `web/context.py`),
admits it past the shutdown tracker (`web/longrunning.py`), arms its deadline when timeouts are
configured (`web/timeout.py`), then runs the gates: kube-apiserver's filter chain in the order
the composition root installs them (authentication, audit, impersonation, max-in-flight,
authorization, upgrade refusal...). A gate reads the context and answers the request itself (a
401, a 403) or lets it go on; a gate that needs no I/O answers without an await. The route's
handler answers everything else. Finishers (the max-in-flight release, the request metrics, the
audit) are told of every request's end, in the order they were added; then the request is
counted by route kind and code and gets an access-log line when `--access-log` asks for one. An
exception a handler did not expect becomes upstream's 500 Status, logged with its traceback; a
client that went away is not an error.

Only what is switched on is in the chain: without an audit policy there is no audit gate,
without limits no max-in-flight gate, without timeouts no deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import Counter

from aggregator.tracing.api import RequestTracer
from aggregator.util.logs import fields
from aggregator.web.accesslog import CLIENT_GONE, AccessLog
from aggregator.web.context import HeadListener, RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Children
from aggregator.web.responses import status_response
from aggregator.web.routing import Router
from aggregator.web.timeout import RequestTimeouts

log = logging.getLogger(__name__)

GateAnswer = web.StreamResponse | None
# A stage before the handler: a response stops the request, None lets it go on. A gate that must
# wait (a review) returns an awaitable of either; one that need not wait answers at once.
Gate = Callable[[RequestContext], "GateAnswer | Awaitable[GateAnswer]"]
# Told of a request's end: the response (None if the client went away first) and the exception a
# handler did not expect, if any.
Finisher = Callable[[RequestContext, web.StreamResponse | None, BaseException | None], None]

INTERNAL_ERROR = "Internal error occurred: the gateway failed to serve this request"


class Pipeline:
    def __init__(
        self,
        router: Router,
        requests: Counter,
        access_log: AccessLog,
        *,
        in_flight: InFlight,
        timeouts: RequestTimeouts | None = None,
        gates: Sequence[Gate] = (),
        head_listeners: Sequence[HeadListener] = (),
        finishers: Sequence[Finisher] = (),
        tracer: RequestTracer | None = None,
    ) -> None:
        self.router = router
        # Tracing hook (`tracing/`): gives each request its span, None when it is not sampled.
        self.tracer = tracer
        self.access_log = access_log
        self.in_flight = in_flight
        self.timeouts = timeouts
        # Lists, so a test (or a benchmark) may take a stage out.
        self.gates: list[Gate] = list(gates)
        self.head_listeners: tuple[HeadListener, ...] = tuple(head_listeners)
        self.finishers: list[Finisher] = list(finishers)
        # `aggregator_requests_total{route, code}`, one child per (route kind, code).
        self._requests = Children(requests)

    def context(self, request: web.Request) -> RequestContext:
        """The context of an HTTP/1.1 request, attached to it for the handlers (`context_of`)."""
        ctx = RequestContext.of_request(
            request, self.router.match(request.path), time.monotonic(), self.head_listeners
        )
        request.gateway_context = ctx
        if self.tracer is not None:  # tracing hook: the span starts with the context
            ctx.span = self.tracer.begin(ctx)
        return ctx

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ctx = self.context(request)
        in_flight = self.in_flight
        refusal = in_flight.enter(ctx)
        if refusal is not None:
            return refusal
        response: web.StreamResponse | None = None
        error: BaseException | None = None
        timeouts = self.timeouts
        try:
            if timeouts is None:
                response = await self._run(ctx)
                return response
            refusal = timeouts.arm(ctx)
            if refusal is not None:
                response = refusal  # a `?timeout=` that is not a Go duration
                return response
            try:
                response = await self._run(ctx)
                if ctx.timed_out:  # the handler swallowed the deadline's cancellation
                    ctx.task.uncancel()
            except asyncio.CancelledError:
                # The deadline cancelled the handler (and nothing else did): answer for it.
                if not ctx.timed_out or ctx.task.uncancel() > 0:
                    raise
                response = timeouts.expired(ctx)
            return response
        except web.HTTPException as exc:
            response = exc
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            error = exc
            log.exception("request failed", extra=fields(method=ctx.method, path=ctx.path))
            response = status_response(ctx, 500, INTERNAL_ERROR)
            return response
        finally:
            if ctx.deadline is not None and timeouts is not None:
                timeouts.disarm(ctx)
            for finisher in self.finishers:
                finisher(ctx, response, error)
            code = response.status if response is not None else CLIENT_GONE
            self._requests(ctx.route.kind.value, code).inc()
            self.access_log.record(ctx, code)
            in_flight.leave(ctx)

    async def _run(self, ctx: RequestContext) -> web.StreamResponse:
        for gate in self.gates:
            answer = gate(ctx)
            if answer is None:
                continue
            if not isinstance(answer, web.StreamResponse):
                answer = await answer
                if answer is None:
                    continue
            return answer
        return await ctx.route.handler(ctx.request)
