"""The request pipeline: match a route, run the gates, serve, count, log.

Gates are kube-apiserver's filter chain in the order the composition root installs them
(authentication, impersonation, authorization, upgrade refusal...): each may answer the request
itself (a 401, a 403) or let it go on. The handler answers everything else. Every request is
counted by route kind and code, and gets an access-log line when `--access-log` asks for one. An exception a
handler did not expect becomes upstream's 500 Status, logged with its traceback; a client that
went away is not an error.

Before any gate, the request's state is attached once (`lifecycle.begin`: its long-running
classification, its arrival time, the status line once it goes out). With timeouts configured,
the gates and the handler run under the request's deadline (`web/timeout.py`), as kube-apiserver's
timeout filters wrap everything after request info. Finishers (the max-in-flight release, the
request metrics, the audit) are told of every request's end, in the order they were added.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter

from aggregator.util.logs import fields
from aggregator.web.accesslog import CLIENT_GONE, AccessLog
from aggregator.web.context import set_route
from aggregator.web.lifecycle import HeadListener, RequestState, begin
from aggregator.web.metrics import Metrics
from aggregator.web.responses import status_response
from aggregator.web.routing import Route, Router
from aggregator.web.timeout import RequestTimeouts

log = logging.getLogger(__name__)

# A stage before the handler: returns a response to stop the request, or None to go on.
Gate = Callable[[web.Request, Route], Awaitable[web.StreamResponse | None]]
# Told of a request's end: the response (None if the client went away first) and the exception a
# handler did not expect, if any.
Finisher = Callable[[web.Request, Route, web.StreamResponse | None, BaseException | None], None]

INTERNAL_ERROR = "Internal error occurred: the gateway failed to serve this request"


class Pipeline:
    def __init__(
        self,
        router: Router,
        metrics: Metrics,
        access_log: AccessLog,
        *,
        timeouts: RequestTimeouts | None = None,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.access_log = access_log
        self.timeouts = timeouts
        self.gates: list[Gate] = []
        self.head_listeners: list[HeadListener] = []
        self.finishers: list[Finisher] = []
        self._counters: dict[tuple[str, int], Counter] = {}

    def add_gate(self, gate: Gate) -> None:
        """Gates run in the order they are added."""
        self.gates.append(gate)

    def on_response_head(self, listener: HeadListener) -> None:
        """Called when a request's status line goes out (`lifecycle.RequestState`)."""
        self.head_listeners.append(listener)

    def on_finish(self, finisher: Finisher) -> None:
        self.finishers.append(finisher)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        route = self.router.match(request.path)
        set_route(request, route)
        state = begin(request, self.head_listeners)
        response: web.StreamResponse | None = None
        error: BaseException | None = None
        try:
            response = await self._serve(request, route, state)
            return response
        except web.HTTPException as exc:
            response = exc
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            error = exc
            log.exception("request failed", extra=fields(method=request.method, path=request.path))
            response = status_response(request, 500, INTERNAL_ERROR)
            return response
        finally:
            for finisher in self.finishers:
                finisher(request, route, response, error)
            self._finished(request, route, response, started)

    async def _serve(self, request: web.Request, route: Route, state: RequestState) -> web.StreamResponse:
        """The gates and the handler, under the request's deadline if it has one."""
        timeouts = self.timeouts
        deadline = timeouts.deadline(request, state) if timeouts is not None else None
        if deadline is None or timeouts is None:
            return await self._run(request, route)
        if isinstance(deadline, web.StreamResponse):
            return deadline  # a `?timeout=` that is not a Go duration
        scope = asyncio.timeout(timeouts.remaining(deadline, state))
        try:
            async with scope:
                return await self._run(request, route)
        except TimeoutError:
            if not scope.expired():
                raise
            return timeouts.expired(request, state, deadline)

    async def _run(self, request: web.Request, route: Route) -> web.StreamResponse:
        for gate in self.gates:
            response = await gate(request, route)
            if response is not None:
                return response
        return await route.handler(request)

    def _finished(
        self, request: web.Request, route: Route, response: web.StreamResponse | None, started: float
    ) -> None:
        code = response.status if response is not None else CLIENT_GONE
        key = (route.kind.value, code)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.requests.labels(route.kind.value, str(code))
        counter.inc()
        self.access_log.record(request, route, code, started)
