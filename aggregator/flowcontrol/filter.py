"""API Priority and Fairness in the request path: `k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go`
and `pkg/util/flowcontrol/apf_filter.go` (`Handle`).

The gate sits where kube-apiserver's filter does: after impersonation (the user is the impersonated
one, so `system:masters` is that user's group) and before authorization. For each request:
- long-running requests other than watches (exec, attach, port-forward, proxy, log) pass untracked;
- the request is classified (FlowSchema, priority level, flow), its seats estimated, and it is
  dispatched at once, queued, or refused (`Reject` levels at their limit, a full queue);
- a queued request waits at most a quarter of the time left to its deadline as it arrived (the
  request timeout's quarter when it has none, as a watch), never more than a minute, then is
  refused;
- a refusal is kube-apiserver's: 429, `Retry-After` from the level's recent refusals
  (`retryafter.py`), Go's `http.Error` text, counted in `apiserver_request_total{code="429"}`
  and `apiserver_request_terminations_total`;
- every classified request's answer (served or refused) carries `X-Kubernetes-PF-FlowSchema-UID`
  and `X-Kubernetes-PF-PriorityLevel-UID` (`setResponseHeaders`); a backend's own values, when it
  runs APF too, follow the gateway's, as kube-aggregator's proxy adds them after its own;
- a request holds its seats until its answer is complete, except a watch, which holds them only
  until its handler starts delegating (`RequestDelegated`): `delegated` is the last gate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from aggregator.flowcontrol.controller import Controller, Level, Schema
from aggregator.flowcontrol.estimator import WatchTracker, WorkEstimator
from aggregator.flowcontrol.metrics import (
    DURATION_BUCKETS,
    WATCH_COUNT_BUCKETS,
    WORK_SEATS_BUCKETS,
    FlowControlMetrics,
)
from aggregator.flowcontrol.queueset import Request
from aggregator.flowcontrol.retryafter import DroppedRequests
from aggregator.model.selectors import SelectorError, exact_match, parse_field_selector
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.inflight import too_many_requests
from aggregator.web.requestlabels import MUTATING_KIND, READ_ONLY_KIND, request_kind
from aggregator.web.requestmetrics import APISERVER, RequestMetrics

log = logging.getLogger(__name__)

# Go's canonical spelling of upstream's names (`Header.Set`), as they appear on the wire.
FLOW_SCHEMA_UID = "X-Kubernetes-Pf-Flowschema-Uid"
PRIORITY_LEVEL_UID = "X-Kubernetes-Pf-Prioritylevel-Uid"
MAX_WAIT = 60.0
_LOG_EVERY = 10.0

GateAnswer = web.StreamResponse | None


class Admission:
    """What APF decided for one request (`RequestContext.priority`)."""

    __slots__ = ("forget_watch", "kind", "level", "request", "schema", "started", "watch")

    def __init__(self, schema: Schema, level: Level, kind: str, watch: bool) -> None:
        self.schema = schema
        self.level = level
        self.kind = kind
        self.watch = watch
        self.request: Request | None = None
        self.started = 0.0
        self.forget_watch: Callable[[], None] | None = None


class PriorityAndFairness:
    """The APF gate, its end-of-chain release for watches, its finisher and its response headers."""

    def __init__(
        self,
        controller: Controller,
        metrics: FlowControlMetrics,
        apiserver: RequestMetrics,
        *,
        request_timeout: float,
        watches: WatchTracker | None = None,
        dropped: DroppedRequests | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.controller = controller
        self.metrics = metrics
        self.apiserver = apiserver
        self.watches = watches or WatchTracker()
        self.estimator = WorkEstimator(self.watches, self._max_seats)
        self.dropped = dropped or DroppedRequests()
        self.clock = clock
        # A request without a deadline (a watch) may wait a quarter of the request timeout.
        self.default_wait = request_timeout / 4
        self.executing = apiserver.inflight
        self.waiting = metrics.waiting
        # Requests waiting and executing, by kind (read_vs_write_current_requests): ro waiting, ro
        # executing, mutating waiting, mutating executing.
        self._read_vs_write = [0, 0, 0, 0]
        self._notes = {kind: _QueueNote(self, kind) for kind in (READ_ONLY_KIND, MUTATING_KIND)}
        self._rejected = 0
        self._last_logged = float("-inf")

    def _max_seats(self, level: str) -> int:
        state = self.controller.levels.get(level)
        return state.max_seats if state is not None else 0

    def counted(self, index: int, delta: int) -> None:
        """One of the read-vs-write counts moved."""
        counts = self._read_vs_write
        counts[index] += delta
        self.metrics.read_vs_write_state.note(self.clock(), tuple(counts))

    # --- the gate -------------------------------------------------------------------------------------

    def gate(self, ctx: RequestContext) -> GateAnswer | Awaitable[GateAnswer]:
        info, user = ctx.info, ctx.user
        if info is None or user is None:
            return None  # authorization answers a request without RequestInfo with upstream's 500
        watch = info.verb == "watch"
        if ctx.long_running and not watch:
            return None
        schema = self.controller.classify(user, info)
        level = schema.level
        admission = ctx.priority = Admission(schema, level, request_kind(info), watch)
        _distinguisher, flow = schema.flow(user, info)
        work, watch_count = self.estimator.estimate(info, ctx.query if ctx.raw_query else {}, level.name)
        m = level.metrics
        fs = schema.fs.name
        seats = schema.work_seats
        if seats is None:
            seats = schema.work_seats = m.histogram(m.work_seats, fs, WORK_SEATS_BUCKETS)
        seats.observe(work.max_seats)
        if watch_count is not None:
            m.observe(m.watch_count, fs, WATCH_COUNT_BUCKETS, watch_count)
        request = level.queues.start_request(work, flow, fs, self._notes[admission.kind])
        if request is None:
            if not level.exempt:
                m.observe(m.wait, (fs, "false"), DURATION_BUCKETS, 0.0)
            return self._reject(ctx, admission)
        admission.request = request
        if request.decided is None:
            if not level.exempt:
                waited = schema.dispatched_wait
                if waited is None:
                    waited = schema.dispatched_wait = m.histogram(m.wait, (fs, "true"), DURATION_BUCKETS)
                waited.observe(0.0)
            self._execute(ctx, admission)
            return None
        return self._wait(ctx, admission, request)

    async def _wait(self, ctx: RequestContext, admission: Admission, request: Request) -> GateAnswer:
        arrived = self.clock()
        deadline = ctx.deadline
        limit = (deadline - ctx.received) / 4 if deadline is not None else self.default_wait
        timeout = ctx.received + min(limit, MAX_WAIT) - arrived
        queues = admission.level.queues
        try:
            dispatched = await queues.wait(request, timeout)
        except BaseException:
            if request.executing:  # dispatched as the client went away: give the seats back
                queues.finish(request)
            raise
        m = admission.level.metrics
        m.observe(m.wait, (admission.schema.fs.name, "true"), DURATION_BUCKETS, self.clock() - arrived)
        if not dispatched:
            return self._reject(ctx, admission)
        self._execute(ctx, admission)
        return None

    def _execute(self, ctx: RequestContext, admission: Admission) -> None:
        """The request takes its seats: counted as dispatched and executing."""
        m = admission.level.metrics
        fs = admission.schema.fs.name
        m.dispatched[fs] = m.dispatched.get(fs, 0) + 1
        now = self.clock()
        admission.started = now
        kind = admission.kind
        self.executing.started(kind)
        self.counted(1 if kind == READ_ONLY_KIND else 3, 1)
        if admission.watch:
            info = ctx.info
            assert info is not None
            admission.forget_watch = self.watches.register(info, lambda name: _pinned(ctx, name))

    def _reject(self, ctx: RequestContext, admission: Admission) -> web.Response:
        level = admission.level
        self.apiserver.dropped(ctx, component=APISERVER)
        self.apiserver.terminated(ctx, 429, component=APISERVER)
        self.dropped.record(level.name)
        self._log(admission)
        return too_many_requests(str(self.dropped.retry_after(level.name)))

    # --- the end of a request's seats --------------------------------------------------------------------

    def delegated(self, ctx: RequestContext) -> None:
        """The last gate: a watch's handler starts, so its seats go back (`RequestDelegated`)."""
        admission = ctx.priority
        if admission is not None and admission.watch:
            self._release(admission)

    def finished(self, ctx: RequestContext, _response: web.StreamResponse | None, _error: BaseException | None) -> None:
        """Finisher: the request is over; its seats (if still held) go back, its watch is forgotten."""
        admission = ctx.priority
        if admission is None:
            return
        self._release(admission)
        if admission.forget_watch is not None:
            admission.forget_watch()
            admission.forget_watch = None

    def _release(self, admission: Admission) -> None:
        request = admission.request
        if request is None or not request.executing:
            return
        level = admission.level
        now = self.clock()
        schema, watch = admission.schema, admission.watch
        executions = schema.executions.get(watch)
        if executions is None:
            m = level.metrics
            key = (schema.fs.name, "watch" if watch else "regular")
            executions = schema.executions[watch] = m.histogram(m.execution, key, DURATION_BUCKETS)
        executions.observe(now - admission.started)
        kind = admission.kind
        self.executing.finished(kind)
        self.counted(1 if kind == READ_ONLY_KIND else 3, -1)
        queues = level.queues
        queues.finish(request)
        if level.quiescing and queues.is_idle():
            self.controller.level_idle(level)

    # --- the answer's headers ------------------------------------------------------------------------------

    def head_going_out(self, ctx: RequestContext, status: int, response: web.StreamResponse | None) -> None:
        """`setResponseHeaders` on every classified request's answer (a head listener)."""
        admission = ctx.priority
        if admission is None or response is None:
            return
        headers = response.headers
        if PRIORITY_LEVEL_UID not in headers and FLOW_SCHEMA_UID not in headers:
            headers[PRIORITY_LEVEL_UID] = admission.level.pl.uid
            headers[FLOW_SCHEMA_UID] = admission.schema.fs.uid
            return
        for name, value in ((PRIORITY_LEVEL_UID, admission.level.pl.uid), (FLOW_SCHEMA_UID, admission.schema.fs.uid)):
            backend = headers.getall(name, ())
            headers[name] = value
            for other in backend:
                headers.add(name, other)

    def _log(self, admission: Admission) -> None:
        """One line per 10 s however many are refused."""
        self._rejected += 1
        now = time.monotonic()
        if now - self._last_logged < _LOG_EVERY:
            return
        self._last_logged = now
        log.warning(
            "API Priority and Fairness refused requests with 429",
            extra=fields(
                priority_level=admission.level.name,
                flow_schema=admission.schema.fs.name,
                refused=self._rejected,
            ),
        )
        self._rejected = 0


class _QueueNote:
    """A kind's requests entering and leaving APF's queues (`queueNote`, the waiting watermark)."""

    __slots__ = ("filter", "index", "kind")

    def __init__(self, apf: PriorityAndFairness, kind: str) -> None:
        self.filter = apf
        self.kind = kind
        self.index = 0 if kind == READ_ONLY_KIND else 2

    def queued(self) -> None:
        self.filter.waiting.started(self.kind)
        self.filter.counted(self.index, 1)

    def dequeued(self) -> None:
        self.filter.waiting.finished(self.kind)
        self.filter.counted(self.index, -1)

    def passed(self) -> None:
        self.filter.waiting.passed(self.kind)


def _pinned(ctx: RequestContext, field_name: str) -> str | None:
    """The value a watch's field selector pins `field_name` to (`RequiresExactMatch`), if any
    (`getIndexValue`: a selector that does not parse pins nothing)."""
    selector = ctx.query.get("fieldSelector") if ctx.raw_query else None
    if not selector:
        return None
    try:
        return exact_match(parse_field_selector(selector[0]), field_name)
    except SelectorError:
        return None
