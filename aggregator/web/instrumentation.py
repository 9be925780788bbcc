"""Feed kube-apiserver's request metrics (`requestmetrics.RequestMetrics`) from the pipeline.

Upstream instruments its handlers, not its filters (installer.go `InstrumentRouteFunc`,
healthz.go `InstrumentHandlerFunc`), so a request counts in `apiserver_request_total` only once
every filter let it through. Here `gate` is the last gate: it marks the request as reaching its
handler (and counts a long-running one in `apiserver_longrunning_requests`, upstream's
`RecordLongRunning`), and `finished` observes it with the code that went out. Components, as
requestmetrics.py explains: `aggregator` for what an APIService's backend serves, `apiserver`
for what kube-apiserver (or the gateway's own APIService API) serves; `/healthz`, `/livez` and
`/readyz` with their path as the subresource and no component. Refusals (401, 403, 429) are not
observed, as upstream; 429s and 504s count through `dropped` and `terminated` where they happen.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

from aiohttp import web

from aggregator.web.lifecycle import get_state
from aggregator.web.requestmetrics import AGGREGATOR, APISERVER, MonitoredRequest, RequestMetrics
from aggregator.web.routing import Route, RouteKind

# The gateway's own routes that serve resources kube-apiserver would (local mode's APIService API).
_APISERVER_OWN_ROUTES = frozenset({"apiregistration"})
# healthz.go instruments the root of each health endpoint, not the single checks below it.
_HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
_LONG_RUNNING = web.RequestKey[AbstractContextManager[None]]("aggregator.longrunning_gauge")


def component_of(route: Route) -> str | None:
    """The `component` label for resource requests this route serves; None: not instrumented."""
    if route.kind is RouteKind.BACKEND:
        return AGGREGATOR
    if route.kind is RouteKind.DELEGATE or route.name in _APISERVER_OWN_ROUTES:
        return APISERVER
    return None


class RequestInstrumentation:
    def __init__(self, metrics: RequestMetrics) -> None:
        self.metrics = metrics

    async def gate(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        """The last gate: the request reaches its handler."""
        state = get_state(request)
        if state is None:
            return None
        state.handled = True
        component = component_of(route)
        if state.long_running and component is not None:
            gauge = self.metrics.long_running(MonitoredRequest.of(request), component=component)
            gauge.__enter__()
            request[_LONG_RUNNING] = gauge
        return None

    def finished(self, request: web.Request, route: Route, response: web.StreamResponse | None) -> None:
        state = get_state(request)
        if state is None or not state.handled:
            return
        gauge = request.pop(_LONG_RUNNING, None)
        if gauge is not None:
            gauge.__exit__(None, None, None)
        code = response.status if response is not None else state.status
        if code is None:
            return  # the client went away before anything was answered
        seconds = time.monotonic() - state.received
        size = 0
        if response is not None:
            size = response.body_length if response.prepared else (response.content_length or 0)
        component = component_of(route)
        if component is not None:
            self.metrics.observe(MonitoredRequest.of(request), code, seconds, size, component=component)
        elif state.instrumented_as is not None:
            subresource, handler_component = state.instrumented_as
            self.metrics.observe_handler(
                MonitoredRequest.of(request),
                code,
                seconds,
                size,
                subresource=subresource,
                component=handler_component,
            )
        elif request.path in _HEALTH_PATHS and request.path == f"/{route.name}":
            self.metrics.observe_handler(
                MonitoredRequest.of(request), code, seconds, size, subresource=request.path, component=""
            )
