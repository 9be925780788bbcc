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

from prometheus_client import Gauge

from aggregator.web.context import ContextKey, RequestContext, Route, RouteKind
from aggregator.web.requestmetrics import AGGREGATOR, APISERVER, RequestMetrics
from aggregator.web.serverrequest import Answer

# The gateway's own routes that serve resources kube-apiserver would (local mode's APIService API).
_APISERVER_OWN_ROUTES = frozenset({"apiregistration"})
# healthz.go instruments the root of each health endpoint, not the single checks below it.
_HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
# Set by a handler upstream wraps in `metrics.InstrumentHandlerFunc` with fixed labels (aggregated
# discovery, OpenAPI v3): the (subresource, component) it is counted under.
INSTRUMENTED_AS = ContextKey[tuple[str, str]]("instrumented-as")


def instrument_as(ctx: RequestContext, subresource: str, component: str) -> None:
    """Count this request in `apiserver_request_total` as upstream's fixed-label handler wrapper
    does (`InstrumentHandlerFunc("GET", "", "", "", subresource, "", component)`)."""
    INSTRUMENTED_AS.set(ctx, (subresource, component))


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
        # The long-running requests' gauges, by request (few: watches and tunnels).
        self._gauges: dict[RequestContext, Gauge] = {}

    def gate(self, ctx: RequestContext) -> None:
        """The last gate: the request reaches its handler."""
        ctx.handled = True
        if ctx.long_running:
            component = component_of(ctx.route)
            if component is not None:
                gauge = self.metrics.long_running_gauge(ctx, component=component)
                if gauge is not None:
                    gauge.inc()
                    self._gauges[ctx] = gauge

    def finished(self, ctx: RequestContext, answer: Answer | None, _error: BaseException | None) -> None:
        if not ctx.handled:
            return
        if ctx.long_running:
            gauge = self._gauges.pop(ctx, None)
            if gauge is not None:
                gauge.dec()
        code = ctx.status
        if code is None:
            return  # the client went away before anything was answered
        seconds = time.monotonic() - ctx.received
        size = answer.body_length if answer is not None else 0
        route = ctx.route
        component = component_of(route)
        if component is not None:
            self.metrics.observe(ctx, code, seconds, size, component=component)
        elif (instrumented := INSTRUMENTED_AS.get(ctx)) is not None:
            subresource, handler_component = instrumented
            self.metrics.observe_handler(
                ctx, code, seconds, size, subresource=subresource, component=handler_component
            )
        elif ctx.path in _HEALTH_PATHS and ctx.path == f"/{route.name}":
            self.metrics.observe_handler(ctx, code, seconds, size, subresource=ctx.path, component="")
