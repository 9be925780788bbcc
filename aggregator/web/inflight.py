"""`--max-requests-inflight` and `--max-mutating-requests-inflight`: kube-apiserver's
`WithMaxInFlightLimit` (k8s.io/apiserver pkg/server/filters/maxinflight.go), without APF.

Two counters, one per request kind (`readOnly`: get, list, watch; `mutating`: everything else),
the very ones `apiserver_current_inflight_requests` publishes (`InflightWatermark`). A request
under its kind's limit is counted and goes on at once: nothing ever waits here. Past the limit it
gets upstream's answer, `429` with `Retry-After: 1` and the plain-text body of
`priority-and-fairness.go tooManyRequests` (`http.Error`: not a Status), and counts in
`apiserver_request_total{code="429"}` and `apiserver_request_terminations_total`.

As upstream: long-running requests (watches, exec, attach, port-forward, proxy, log) are never
counted; a member of `system:masters` past the limit is served (uncounted); the gate sits after
impersonation, so that group is the impersonated user's; a limit of 0 lifts that kind's limit.
"""

from __future__ import annotations

import logging

from aggregator.model.userinfo import MASTERS_GROUP
from aggregator.util.logs import fields
from aggregator.util.logthrottle import LogThrottle
from aggregator.web.context import ContextKey, RequestContext
from aggregator.web.requestlabels import MUTATING_KIND, READ_ONLY_KIND, request_kind
from aggregator.web.requestmetrics import APISERVER, RequestMetrics
from aggregator.web.serverrequest import Answer, Response

log = logging.getLogger(__name__)

RETRY_AFTER = "1"  # maxinflight.go retryAfter
TOO_MANY_REQUESTS = "Too many requests, please try again later."
# The request kind a request was counted under, to give its place back at the end.
INFLIGHT_KIND = ContextKey[str]("inflight-kind")


def too_many_requests(retry_after: str = RETRY_AFTER) -> Response:
    """`tooManyRequests`: `Retry-After` (max-in-flight's 1 s, or API Priority and Fairness's computed
    delay), then Go's `http.Error` (text, nosniff, a trailing newline)."""
    return Response(
        429,
        (TOO_MANY_REQUESTS + "\n").encode(),
        {
            "Retry-After": retry_after,
            "Content-Type": "text/plain; charset=utf-8",
            "X-Content-Type-Options": "nosniff",
        },
    )


class MaxInFlight:
    """The gate (after impersonation, before authorization) and the release at the request's end."""

    def __init__(self, metrics: RequestMetrics, *, read_only: int, mutating: int) -> None:
        self.metrics = metrics
        self.limits = {READ_ONLY_KIND: read_only, MUTATING_KIND: mutating}
        self._watermark = metrics.inflight
        self._refusals = LogThrottle(10.0)

    @property
    def enabled(self) -> bool:
        """Whether either kind has a limit (both 0: the pipeline has no max-in-flight gate)."""
        return any(self.limits.values())

    def gate(self, ctx: RequestContext) -> Response | None:
        info = ctx.info
        if ctx.long_running or info is None:
            return None  # no RequestInfo: authorization answers it with upstream's 500
        kind = request_kind(info)
        limit = self.limits[kind]
        if limit == 0 or self._watermark.executing(kind) < limit:
            self._watermark.moved(kind, 1)  # `started` in one call
            INFLIGHT_KIND.set(ctx, kind)
            return None
        user = ctx.user
        if user is not None and MASTERS_GROUP in user.groups:
            return None
        self.metrics.dropped(ctx, component=APISERVER)
        self.metrics.terminated(ctx, 429, component=APISERVER)
        self._log(kind, limit)
        return too_many_requests()

    def finished(self, ctx: RequestContext, _answer: Answer | None, _error: BaseException | None) -> None:
        """Give the request's place back (a no-op for one that was never counted)."""
        kind = INFLIGHT_KIND.get(ctx)
        if kind is not None:
            del ctx.values[INFLIGHT_KIND]
            self._watermark.moved(kind, -1)  # `finished` in one call

    def _log(self, kind: str, limit: int) -> None:
        """One line per 10 s however many are refused: a flood must not become a log flood."""
        refused = self._refusals.count()
        if refused:
            flag = "--max-requests-inflight" if kind == READ_ONLY_KIND else "--max-mutating-requests-inflight"
            log.warning(
                "too many requests in flight; answering 429",
                extra=fields(kind=kind, limit=limit, flag=flag, refused=refused),
            )
