"""The request pipeline: match a route, run the gates, serve, count, log.

Gates are kube-apiserver's filter chain in the order the composition root installs them
(authentication, impersonation, authorization, upgrade refusal...): each may answer the request
itself (a 401, a 403) or let it go on. The handler answers everything else. Every request is
counted by route kind and code, and gets an access-log line when `--access-log` asks for one. An exception a
handler did not expect becomes upstream's 500 Status, logged with its traceback; a client that
went away is not an error.
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
from aggregator.web.metrics import Metrics
from aggregator.web.responses import status_response
from aggregator.web.routing import Route, Router

log = logging.getLogger(__name__)

# A stage before the handler: returns a response to stop the request, or None to go on.
Gate = Callable[[web.Request, Route], Awaitable[web.StreamResponse | None]]

INTERNAL_ERROR = "Internal error occurred: the gateway failed to serve this request"


class Pipeline:
    def __init__(self, router: Router, metrics: Metrics, access_log: AccessLog) -> None:
        self.router = router
        self.metrics = metrics
        self.access_log = access_log
        self.gates: list[Gate] = []
        self._counters: dict[tuple[str, int], Counter] = {}

    def add_gate(self, gate: Gate) -> None:
        """Gates run in the order they are added."""
        self.gates.append(gate)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        route = self.router.match(request.path)
        set_route(request, route)
        response: web.StreamResponse | None = None
        try:
            for gate in self.gates:
                response = await gate(request, route)
                if response is not None:
                    return response
            response = await route.handler(request)
            return response
        except web.HTTPException as exc:
            response = exc
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("request failed", extra=fields(method=request.method, path=request.path))
            response = status_response(request, 500, INTERNAL_ERROR)
            return response
        finally:
            self._finished(request, route, response, started)

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
