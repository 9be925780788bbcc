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
  until its handler starts delegating (`RequestDelegated`): its route's handler is wrapped to give
  them back as it starts.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from dataclasses import replace

from multidict import CIMultiDict

from aggregator.flowcontrol.controller import FLOW_SCHEMA_UID, PRIORITY_LEVEL_UID, Controller, Level, Schema
from aggregator.flowcontrol.estimator import WatchTracker, WorkEstimator
from aggregator.flowcontrol.metrics import (
    EXECUTING,
    MUTATING,
    READ_ONLY,
    WAITING,
    FlowControlMetrics,
    Occupancy,
)
from aggregator.flowcontrol.queueset import ONE_SEAT, Request, WorkEstimate
from aggregator.flowcontrol.retryafter import DroppedRequests
from aggregator.model.selectors import SelectorError, exact_match, parse_field_selector
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.inflight import too_many_requests
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.requestlabels import MUTATING_KIND, READ_ONLY_KIND
from aggregator.web.requestmetrics import APISERVER, KindCount, RequestMetrics
from aggregator.web.serverrequest import Answer, Response

log = logging.getLogger(__name__)

MAX_WAIT = 60.0
_READ_ONLY = frozenset({"get", "list", "watch"})  # maxinflight.go nonMutatingRequestVerbs
_SIZED = frozenset({"list", "watch", "create", "update", "patch", "delete"})  # the estimators' verbs
_LOG_EVERY = 10.0
_METRIC_KIND = {READ_ONLY_KIND: READ_ONLY, MUTATING_KIND: MUTATING}

GateAnswer = Response | None


class Refused:
    """What APF decided for a request it refused (`RequestContext.priority`: the headers need it).
    It holds no seats and forgets no watch: read as a `Request` would be, it says so."""

    __slots__ = ("schema",)

    executing = False
    watch = False
    forget_watch = None

    def __init__(self, schema: Schema) -> None:
        self.schema = schema


class PriorityAndFairness:
    """The APF gate, its finisher and its response headers."""

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
        # Requests waiting and executing, by kind, over time (read_vs_write_current_requests).
        counts = metrics.read_vs_write_counts
        self._lanes = {
            kind: _Lane(kind, self.executing.counts[kind], counts[EXECUTING, _METRIC_KIND[kind]], self.waiting.counts[kind])
            for kind in _METRIC_KIND
        }
        self._read_only, self._mutating = self._lanes[READ_ONLY_KIND], self._lanes[MUTATING_KIND]
        self._waiting_counts = {kind: counts[WAITING, _METRIC_KIND[kind]] for kind in _METRIC_KIND}
        self._notes = {kind: _QueueNote(self, kind) for kind in (READ_ONLY_KIND, MUTATING_KIND)}
        self._rejected = 0
        self._last_logged = float("-inf")

    def _max_seats(self, level: str) -> int:
        state = self.controller.levels.get(level)
        return state.max_seats if state is not None else 0

    def queued(self, kind: str, delta: int) -> None:
        """A request of `kind` entered (1) or left (-1) its queue."""
        self.waiting.moved(kind, delta)
        self._waiting_counts[kind].move(self.clock(), delta)

    # --- the gate -------------------------------------------------------------------------------------

    def gate(self, ctx: RequestContext) -> GateAnswer | Awaitable[GateAnswer]:
        """Classify, estimate, then dispatch, queue or refuse (`priorityAndFairnessHandler.Handle`).
        The common case (a one-seat request dispatched at once) is written out inline: it runs for
        nearly every request, and each call it avoids is a measurable share of a request's cost."""
        info, user = ctx.info, ctx.user
        if info is None or user is None:
            return None  # authorization answers a request without RequestInfo with upstream's 500
        verb = info.verb
        watch = verb == "watch"
        if ctx.long_running and not watch:
            return None
        known = self.controller.decided.get(user.name)
        found = None
        if known is not None and known[0] == user.groups:
            found = known[2] if info.is_resource_request else known[1]
        if found is None:  # a user not seen since the last change, or rules to match one by one
            schema = self.controller.classify(user, info)
            flow = schema.flow(user, info)
        else:
            schema, flow = found
            if flow < 0:  # distinguished by namespace
                flow = schema.flow(user, info)
        level = schema.level
        lane = self._read_only if verb in _READ_ONLY else self._mutating
        stats = schema.stats
        if verb in _SIZED:
            work, watch_count = self.estimator.estimate(info, ctx.query if ctx.raw_query else {}, level.name)
            if watch_count is not None:
                stats.watch_count.observe(watch_count)
            if work is not ONE_SEAT:
                stats.work_seats.observe(work.max_seats)
                return self._start(ctx, schema, lane, watch, work, flow)
        request = level.queues.start_one(flow, stats)
        if request is None:
            stats.one_seat += 1  # estimated: one seat
            return self._start(ctx, schema, lane, watch, ONE_SEAT, flow)
        # (start_one counted it: dispatched, one seat, waited 0 s, passed its queue)
        request.schema = schema
        request.lane = lane
        request.watch = watch
        ctx.priority = request
        now = request.start
        if request.queue is not None:  # it passed through its queue in an instant
            waited = lane.waiting  # (`WaitingWatermark.passed`, its commonest case written out)
            if waited.current or now >= self.waiting.window_end:
                self.waiting.passed(lane.kind, now)
            elif not waited.mark:
                waited.mark = 1
        occupancy = lane.occupancy
        try:
            occupancy.times[occupancy.value] += now - occupancy.since
        except IndexError:
            occupancy.move(now, 1)
        else:
            occupancy.since = now
            occupancy.value += 1
        count = lane.executing
        count.current = value = count.current + 1
        if now >= self.executing.window_end:
            self.executing.tick(now)
        if value > count.mark:
            count.mark = value
        if watch:
            self._watching(ctx, request, info)
        return None

    def _start(
        self, ctx: RequestContext, schema: Schema, lane: _Lane, watch: bool, work: WorkEstimate, flow: int
    ) -> GateAnswer | Awaitable[GateAnswer]:
        """The general case: queued, refused, wider than a seat, or a Reject level."""
        level = schema.level
        stats = schema.stats
        request = level.queues.start_request(work, flow, stats, self._notes[lane.kind])
        if request is None:
            ctx.priority = Refused(schema)
            if not level.exempt:
                stats.waited("false").observe(0.0)
            return self._reject(ctx, level)
        request.schema = schema
        request.lane = lane
        request.watch = watch
        ctx.priority = request
        if request.decided is None:
            if not level.exempt:
                stats.waited_none += 1
            self._execute(ctx, request)
            return None
        return self._wait(ctx, request)

    async def _wait(self, ctx: RequestContext, request: Request) -> GateAnswer:
        arrived = self.clock()
        deadline = ctx.deadline
        limit = (deadline - ctx.received) / 4 if deadline is not None else self.default_wait
        timeout = ctx.received + min(limit, MAX_WAIT) - arrived
        schema = request.schema
        queues = schema.level.queues
        try:
            dispatched = await queues.wait(request, timeout)
        except BaseException:
            if request.executing:  # dispatched as the client went away: give the seats back
                queues.finish(request)
            raise
        schema.stats.waited("true").observe(self.clock() - arrived)
        if not dispatched:
            ctx.priority = Refused(schema)
            return self._reject(ctx, schema.level)
        self._execute(ctx, request)
        return None

    def _execute(self, ctx: RequestContext, request: Request) -> None:
        """The request takes its seats: counted as dispatched and executing."""
        request.stats.dispatched += 1
        self._executing(request.lane, request.start, 1)
        if request.watch:
            info = ctx.info
            assert info is not None
            self._watching(ctx, request, info)

    def _watching(self, ctx: RequestContext, request: Request, info: RequestInfo) -> None:
        """A watch: the estimator counts it while it lasts, and it holds its seats only until its
        handler starts (`RequestDelegated`). Its route's handler is wrapped to give them back first:
        no other request pays for a last gate."""
        request.forget_watch = self.watches.register(info, lambda name: _pinned(ctx, name))
        route = ctx.route
        handler = route.handler
        finished = self.finished

        async def delegated(ctx: RequestContext) -> Answer:
            # The finisher gives the seats back; the watch stays counted until it ends.
            forget, request.forget_watch = request.forget_watch, None
            finished(ctx, None, None)
            request.forget_watch = forget
            return await handler(ctx)

        ctx.route = replace(route, handler=delegated)

    def _executing(self, lane: _Lane, now: float, delta: int) -> None:
        """A request of the lane's kind starts (1) or stops (-1) executing at `now`: the count
        `apiserver_current_inflight_requests` publishes (`InflightWatermark.moved`) and its occupancy
        over time (`Occupancy.move`), both written out. For the general path: the gate's fast path
        and `finished` write it out again (a call is a measurable share of a request's cost)."""
        occupancy = lane.occupancy
        try:
            occupancy.times[occupancy.value] += now - occupancy.since
        except IndexError:
            occupancy.move(now, delta)
        else:
            occupancy.since = now
            occupancy.value += delta
        count = lane.executing
        count.current = value = count.current + delta
        if now >= self.executing.window_end:
            self.executing.tick(now)
        if value > count.mark:
            count.mark = value

    def _reject(self, ctx: RequestContext, level: Level) -> Response:
        self.apiserver.dropped(ctx, component=APISERVER)
        self.apiserver.terminated(ctx, 429, component=APISERVER)
        self.dropped.record(level.name)
        self._log(level, ctx.priority.schema)
        return too_many_requests(str(self.dropped.retry_after(level.name)))

    # --- the end of a request's seats --------------------------------------------------------------------

    def finished(self, ctx: RequestContext, _answer: Answer | None, _error: BaseException | None) -> None:
        """Finisher: the request is over; its seats (if still held) go back, its watch (if it has
        one) is forgotten. (A watch's wrapped handler calls it as it starts, without the watch.)"""
        request = ctx.priority
        if request is None:
            return
        if request.executing:  # its seats go back
            stats = request.stats
            executions = stats.execution("watch") if request.watch else stats.regular
            now = self.clock()
            took = now - request.start
            executions.counts[bisect_left(executions.bounds, took)] += 1
            executions.total += took
            lane = request.lane
            occupancy = lane.occupancy
            try:
                occupancy.times[occupancy.value] += now - occupancy.since
            except IndexError:
                occupancy.move(now, -1)
            else:
                occupancy.since = now
                occupancy.value -= 1
            count = lane.executing
            count.current = value = count.current - 1
            if now >= self.executing.window_end:
                self.executing.tick(now)
            if value > count.mark:
                count.mark = value
            level = request.schema.level
            queues = level.queues
            queues.finish(request, now)
            if level.quiescing and queues.is_idle():
                self.controller.level_idle(level)
        forget = request.forget_watch
        if forget is not None:
            request.forget_watch = None
            forget()

    # --- the answer's headers ------------------------------------------------------------------------------

    def head_going_out(self, ctx: RequestContext, status: int, headers: CIMultiDict[str]) -> None:
        """`setResponseHeaders` on every classified request's answer (a head listener)."""
        priority = ctx.priority
        if priority is None:
            return
        schema = priority.schema
        if PRIORITY_LEVEL_UID not in headers and FLOW_SCHEMA_UID not in headers:
            # (absent: no need to replace) encoded once, last in the head as `add` puts them
            ctx.request.add_encoded_headers(headers, schema.headers)
            return
        for name, value in ((PRIORITY_LEVEL_UID, schema.pl_uid), (FLOW_SCHEMA_UID, schema.fs_uid)):
            backend = headers.getall(name, ())
            headers[name] = value
            for other in backend:
                headers.add(name, other)

    def _log(self, level: Level, schema: Schema) -> None:
        """One line per 10 s however many are refused."""
        self._rejected += 1
        now = time.monotonic()
        if now - self._last_logged < _LOG_EVERY:
            return
        self._last_logged = now
        log.warning(
            "API Priority and Fairness refused requests with 429",
            extra=fields(priority_level=level.name, flow_schema=schema.fs_name, refused=self._rejected),
        )
        self._rejected = 0


class _Lane:
    """What a request kind's requests move on the request path: the count of those executing that
    `apiserver_current_inflight_requests` publishes, its occupancy over time
    (`read_vs_write_current_requests`), and the count of those waiting (`WaitingWatermark`).
    A request holds its kind's lane (`Request.lane`): its finisher finds them without a lookup."""

    __slots__ = ("executing", "kind", "occupancy", "waiting")

    def __init__(self, kind: str, executing: KindCount, occupancy: Occupancy, waiting: KindCount) -> None:
        self.kind = kind
        self.executing = executing
        self.occupancy = occupancy
        self.waiting = waiting


class _QueueNote:
    """A kind's requests entering and leaving APF's queues (`queueNote`, the waiting watermark)."""

    __slots__ = ("filter", "kind")

    def __init__(self, apf: PriorityAndFairness, kind: str) -> None:
        self.filter = apf
        self.kind = kind

    def queued(self) -> None:
        self.filter.queued(self.kind, 1)

    def dequeued(self) -> None:
        self.filter.queued(self.kind, -1)

    def passed(self, now: float) -> None:
        self.filter.waiting.passed(self.kind, now)


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
