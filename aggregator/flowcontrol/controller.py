"""The APF configuration in force: `k8s.io/apiserver/pkg/util/flowcontrol/apf_controller.go`.

`digest` turns the priority levels and FlowSchemas (all of them, at once, as upstream's
`digestConfigObjects` does) into what requests are matched against and queued in:
- priority levels keep their queues across changes; one that disappears keeps serving what it holds
  and is dropped once idle (quiescing); the mandatory `exempt` and `catch-all` exist even when no
  object says so (imagined from the bootstrap ones);
- FlowSchemas whose priority level is missing are ignored (dangling); the rest are ordered by
  matchingPrecedence then name, with the mandatory ones supplied if missing;
- each level's nominal seats are `ceil(server limit * shares / sum of shares)`, its lendable and
  borrowable seats its percentages of that (Go's rounding: half away from zero), and its current
  limit is set by the borrowing adjustment, every 10 s from the seat demand each level saw
  (`update_borrowing`: `updateBorrowingLocked` with `computeConcurrencyAllocation`).

`classify` is `startRequest`'s matching: the first FlowSchema one of whose rules matches both the
user and the request, else catch-all; its flow distinguisher (user or namespace) and the flow's
hash (`hashFlowID`: SHA-256 of the schema name, a NUL and the distinguisher) when the level has
more than one queue. Which rules a user's subjects pass is remembered per (name, groups), so a
request evaluates only the request half of the rules that can match.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from multidict import istr

from aggregator.flowcontrol import bootstrap
from aggregator.flowcontrol.allocation import AllocationError, AllocItem, compute_allocation
from aggregator.flowcontrol.integrator import IntegratorResults, Moments, results_of
from aggregator.flowcontrol.matching import RuleTest, compile_rules
from aggregator.flowcontrol.metrics import FlowControlMetrics, LevelMetrics
from aggregator.flowcontrol.objects import (
    BY_NAMESPACE,
    BY_USER,
    CATCH_ALL,
    EXEMPT,
    EXEMPT_TYPE,
    QUEUE,
    FlowSchema,
    PriorityLevel,
)
from aggregator.flowcontrol.queueset import QueueSet, QueuingConfig
from aggregator.flowcontrol.shufflesharding import Dealer, DealerError
from aggregator.model.userinfo import UserInfo
from aggregator.util.logs import fields
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.serverrequest import EncodedHeaders

log = logging.getLogger(__name__)

# Go's canonical spelling of upstream's response headers (`Header.Set`), as they appear on the wire.
# (istr: multidict looks them up without folding their case again.)
FLOW_SCHEMA_UID = istr("X-Kubernetes-Pf-Flowschema-Uid")
PRIORITY_LEVEL_UID = istr("X-Kubernetes-Pf-Prioritylevel-Uid")
BORROWING_ADJUSTMENT_PERIOD = 10.0
SEAT_DEMAND_SMOOTHING = 0.977
MAX_SEATS_PERCENT = 0.15
_USER_CACHE = 4096


def go_round(x: float) -> int:
    """Go's `math.Round`: half away from zero."""
    t = math.trunc(x)
    if abs(x - t) >= 0.5:
        t += 1 if x > 0 else -1
    return int(t)


def hash_flow(schema: str, distinguisher: str) -> int:
    """`hashFlowID`."""
    digest = hashlib.sha256(schema.encode() + b"\0" + distinguisher.encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass
class SeatDemandStats:
    avg: float = 0.0
    std_dev: float = 0.0
    high_watermark: int = 0
    smoothed: float = 0.0

    def update(self, obs: IntegratorResults) -> None:
        self.high_watermark = go_round(obs.max)
        if obs.duration <= 0:
            return
        deviation = 0.0 if math.isnan(obs.deviation) else obs.deviation
        self.avg = obs.average
        self.std_dev = deviation
        envelope = obs.average + deviation
        self.smoothed = max(envelope, SEAT_DEMAND_SMOOTHING * self.smoothed + (1 - SEAT_DEMAND_SMOOTHING) * envelope)


class BrokenLevel(ValueError):
    """A priority level this package cannot serve (`queueSetCompleterForPL`'s refusals)."""


def queuing_config(pl: PriorityLevel) -> QueuingConfig:
    """`queueSetCompleterForPL`'s checks and the queuing configuration of a level."""
    spec = pl.spec
    if (spec.type == "Limited") != (spec.limited is not None):
        raise BrokenLevel("broken union structure at the top, for Limited")
    if (spec.type == EXEMPT_TYPE) != (spec.exempt is not None):
        raise BrokenLevel("broken union structure at the top, for Exempt")
    if (spec.type == EXEMPT_TYPE) != (pl.name == EXEMPT):
        raise BrokenLevel("non-alignment between name and type")
    if spec.limited is None:
        return QueuingConfig(pl.name, -1)
    response = spec.limited.limit_response
    if (response.type == "Reject") != (response.queuing is None):
        raise BrokenLevel("broken union structure for limit response")
    queuing = response.queuing
    if queuing is None:
        return QueuingConfig(pl.name)
    config = QueuingConfig(pl.name, queuing.queues, queuing.queue_length_limit, queuing.hand_size)
    try:
        Dealer(queuing.queues, queuing.hand_size)
    except DealerError as err:
        raise BrokenLevel(
            f"priority level {pl.name!r} has an invalid queuing configuration: the QueueSetConfig implies an "
            f"invalid shuffle sharding config (DesiredNumQueues is deckSize): {err}"
        ) from err
    return config


class Level:
    """One priority level's state (`priorityLevelState`)."""

    def __init__(
        self,
        pl: PriorityLevel,
        config: QueuingConfig,
        metrics: LevelMetrics,
        *,
        clock: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], object],
    ) -> None:
        self.pl = pl
        self.config = config
        self.metrics = metrics
        self.stats = SeatDemandStats()
        self.quiescing = False
        self.nominal = self.min_cl = self.max_cl = self.current_cl = 0
        self.max_seats = 0
        self.fresh = True  # no queues yet: the current limit starts at nominal - lendable/2
        self.queues = QueueSet(QueuingConfig(config.name), metrics, clock=clock, call_later=call_later)

    @property
    def name(self) -> str:
        return self.pl.name

    @property
    def exempt(self) -> bool:
        return self.pl.spec.type == EXEMPT_TYPE

    def demand_moments(self, now: float) -> tuple[Moments, float, float]:
        """The seat demand since the last call: its moments and extremes (the period starts over)."""
        seconds, integral, squares, low, high = self.metrics.take_demand(now)
        return Moments(seconds, integral, squares), low, high

    def demand_results(self, now: float) -> IntegratorResults:
        """`integrator.Reset`."""
        return results_of(*self.demand_moments(now))

    @property
    def queued(self) -> bool:
        """More than one queue: requests are hashed to flows."""
        return self.config.desired_queues > 1


BY_NOTHING, BY_USER_NAME, BY_REQUEST_NAMESPACE = 0, 1, 2


class Schema:
    """A FlowSchema in force, compiled, with the level it sends requests to; what the request path
    reads of it is kept in plain attributes (it runs for every request)."""

    __slots__ = ("fs", "fs_name", "fs_uid", "hashes", "headers", "level", "method", "pl_uid", "queued", "rules", "stats")

    def __init__(self, fs: FlowSchema, level: Level, rules: tuple[RuleTest, ...]) -> None:
        self.fs = fs
        self.level = level
        self.rules = rules
        self.fs_name = fs.name
        self.fs_uid = fs.uid
        self.pl_uid = level.pl.uid
        # `setResponseHeaders`' two headers, the same on every answer: encoded once.
        self.headers = EncodedHeaders(((PRIORITY_LEVEL_UID, self.pl_uid), (FLOW_SCHEMA_UID, self.fs_uid)))
        self.queued = level.config.desired_queues > 1  # requests are hashed to flows
        method = fs.spec.distinguisher
        self.method = BY_USER_NAME if method == BY_USER else BY_REQUEST_NAMESPACE if method == BY_NAMESPACE else BY_NOTHING
        self.hashes: dict[str, int] = {}
        self.stats = level.metrics.flow(fs.name)  # its series in its level's metrics

    @property
    def name(self) -> str:
        return self.fs_name

    def distinguisher(self, user: UserInfo, info: RequestInfo) -> str:
        """`computeFlowDistinguisher`."""
        method = self.method
        return user.name if method == BY_USER_NAME else info.namespace if method == BY_REQUEST_NAMESPACE else ""

    def flow(self, user: UserInfo, info: RequestInfo) -> int:
        """The flow's hash (`hashFlowID` of the distinguisher): 0 for a level with one queue or none."""
        if not self.queued:
            return 0
        return self._hash(self.distinguisher(user, info))

    def user_flow(self, user: UserInfo) -> int:
        """`flow` for every request of `user`, or -1 where it depends on the request (its namespace)."""
        if not self.queued:
            return 0
        method = self.method
        if method == BY_REQUEST_NAMESPACE:
            return -1
        return self._hash(user.name if method == BY_USER_NAME else "")

    def _hash(self, distinguisher: str) -> int:
        value = self.hashes.get(distinguisher)
        if value is None:
            if len(self.hashes) >= _USER_CACHE:
                self.hashes.clear()
            value = self.hashes[distinguisher] = hash_flow(self.fs_name, distinguisher)
        return value


# What a user's requests of one sort (resource or not) may match: the schemas in order with the
# rules whose subjects it passes, or the one schema that matches all of them.
Candidates = Schema | tuple[tuple[Schema, tuple[RuleTest, ...]], ...]
# The schema every request of one sort of a user's matches, and their flow (`Schema.user_flow`).
Decision = tuple[Schema, int]


def _shortest(found: list[tuple[Schema, tuple[RuleTest, ...]]], everything: Callable[[RuleTest], bool]) -> Candidates:
    if found and any(everything(t) for t in found[0][1]):
        return found[0][0]
    return tuple(found)


def _decision(candidates: Candidates, user: UserInfo) -> Decision | None:
    return (candidates, candidates.user_flow(user)) if isinstance(candidates, Schema) else None


class Controller:
    """The configuration in force and its levels' queues, for one process."""

    def __init__(
        self,
        server_concurrency_limit: int,
        metrics: FlowControlMetrics,
        *,
        clock: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], object],
    ) -> None:
        self.server_concurrency_limit = server_concurrency_limit
        self.metrics = metrics
        self.clock = clock
        self.call_later = call_later
        self.levels: dict[str, Level] = {}
        self.schemas: list[Schema] = []
        self.nominal_cl_sum = 0
        self._catch_all: Schema | None = None
        # What each (user name, groups) may match (`_candidates`): the request path reads it.
        self.by_user: dict[tuple[str, tuple[str, ...]], tuple[Candidates, Candidates]] = {}
        # The request path's shortcut: per user name, the groups it was decided for, then the
        # `Decision` for its non-resource requests and for its resource requests, None for a sort
        # whose requests must be matched one by one (`classify`). Keyed by the name alone: the
        # request path then compares the groups instead of hashing a new (name, groups) tuple.
        self.decided: dict[str, tuple[tuple[str, ...], Decision | None, Decision | None]] = {}
        self._objects: tuple[list[PriorityLevel], list[FlowSchema]] = ([], [])
        self._reap_scheduled = False
        # Told after every digest and borrowing adjustment (worker seat sharing follows the limits).
        self.listeners: list[Callable[[], None]] = []
        self.digest([], [])

    # --- configuration -------------------------------------------------------------------------------

    def digest(self, levels: Iterable[PriorityLevel], schemas: Iterable[FlowSchema]) -> None:
        """`lockAndDigestConfigObjects`: the whole configuration, from every object there is."""
        levels, schemas = list(levels), list(schemas)
        self._objects = (levels, schemas)
        new: dict[str, Level] = {}
        share_sum = 0.0
        have_exempt = have_catch_all = False
        for pl in levels:
            try:
                config = queuing_config(pl)
            except BrokenLevel as err:
                log.warning(
                    "ignoring a PriorityLevelConfiguration whose spec is broken",
                    extra=fields(name=pl.name, reason=str(err)),
                )
                continue
            state = self.levels.get(pl.name)
            if state is None:
                state = Level(pl, config, self.metrics.level(pl.name), clock=self.clock, call_later=self.call_later)
            state.pl, state.config = pl, config
            if state.quiescing:
                log.info("a priority level was undesired and has become desired again", extra=fields(name=pl.name))
                state.quiescing = False
            new[pl.name] = state
            share_sum += pl.shares()[0]
            have_exempt = have_exempt or pl.name == EXEMPT
            have_catch_all = have_catch_all or pl.name == CATCH_ALL
        kept = self._digest_schemas(schemas, new)
        for name, state in self.levels.items():
            if name in new:
                continue
            mandatory = (name == EXEMPT and not have_exempt) or (name == CATCH_ALL and not have_catch_all)
            if not mandatory:
                if state.queues.is_idle():
                    log.info("removing an undesired priority level", extra=fields(name=name))
                    continue
                if not state.quiescing:
                    log.info("a priority level became undesired; it drains before going", extra=fields(name=name))
                    state.quiescing = True
            share_sum += state.pl.shares()[0]
            have_exempt = have_exempt or name == EXEMPT
            have_catch_all = have_catch_all or name == CATCH_ALL
            new[name] = state
        for proto, have in ((bootstrap.EXEMPT_LEVEL, have_exempt), (bootstrap.CATCH_ALL_LEVEL, have_catch_all)):
            if not have:
                state = Level(proto, queuing_config(proto), self.metrics.level(proto.name), clock=self.clock, call_later=self.call_later)
                new[proto.name] = state
                share_sum += proto.shares()[0]
        self._finish(new, share_sum)
        self.levels = new
        self.schemas = [
            Schema(fs, new[fs.spec.priority_level], tuple(compile_rules(r) for r in fs.spec.rules)) for fs in kept
        ]
        self._catch_all = next((s for s in self.schemas if s.name == CATCH_ALL), None)
        self.by_user = {}
        self.decided = {}
        for listener in self.listeners:
            listener()

    @staticmethod
    def _digest_schemas(schemas: list[FlowSchema], levels: dict[str, Level]) -> list[FlowSchema]:
        """`digestFlowSchemasLocked`: the FlowSchemas whose level exists, in matching order, with the
        mandatory ones supplied (their levels are imagined if need be)."""
        kept = []
        have_exempt = have_catch_all = False
        for fs in schemas:
            if fs.spec.priority_level not in levels:
                log.debug("ignoring a FlowSchema whose priority level does not exist", extra=fields(name=fs.name))
                continue
            kept.append(fs)
            have_exempt = have_exempt or fs.name == EXEMPT
            have_catch_all = have_catch_all or fs.name == CATCH_ALL
        kept.sort(key=lambda fs: (fs.spec.matching_precedence, fs.name))
        if not have_exempt:
            kept.insert(0, bootstrap.EXEMPT_SCHEMA)
        if not have_catch_all:
            kept.append(bootstrap.CATCH_ALL_SCHEMA)
        return kept

    def _finish(self, levels: dict[str, Level], share_sum: float) -> None:
        """`finishQueueSetReconfigsLocked`: nominal, lower and upper limits, then the borrowing."""
        server = self.server_concurrency_limit
        total = waiting = 0
        for state in levels.values():
            shares, lendable_percent, borrowing_percent = state.pl.shares()
            nominal = math.ceil(server * shares / share_sum) if share_sum > 0 else 0
            lendable = go_round(nominal * lendable_percent / 100) if lendable_percent is not None else 0
            borrowing = go_round(nominal * borrowing_percent / 100) if borrowing_percent is not None else server
            state.nominal, state.min_cl, state.max_cl = nominal, nominal - lendable, nominal + borrowing
            state.metrics.limits = (nominal, nominal - lendable, nominal + borrowing)
            total += nominal
            limited = state.pl.spec.limited
            if limited is not None and limited.limit_response.type == QUEUE and limited.limit_response.queuing:
                queuing = limited.limit_response.queuing
                waiting += queuing.queues * queuing.queue_length_limit
                hand_size = queuing.hand_size
                state.max_seats = int(max(1, min(math.ceil(nominal * MAX_SEATS_PERCENT), nominal // hand_size)))
            if state.fresh:
                state.fresh = False
                state.stats = SeatDemandStats()
                state.current_cl = nominal - lendable // 2
        self.nominal_cl_sum = total
        self.metrics.set_read_vs_write_denominators(waiting, total)  # maxWaiting/maxExecutingRequests
        self.update_borrowing(levels, fresh_config=True)

    # --- borrowing ---------------------------------------------------------------------------------------

    def update_borrowing(
        self,
        levels: dict[str, Level] | None = None,
        *,
        demand: dict[str, IntegratorResults] | None = None,
        fresh_config: bool = False,
    ) -> None:
        """`updateBorrowingLocked`: each level's current limit from its seat demand since the last
        adjustment (its own integrator's, or `demand` as the worker processes report it)."""
        standalone = levels is None
        levels = self.levels if levels is None else levels
        now = self.clock()
        items: list[AllocItem] = []
        index_of: dict[str, int] = {}
        exempt_current: dict[str, int] = {}
        min_cl_sum = min_current_sum = 0
        remaining = self.nominal_cl_sum
        for name, state in levels.items():
            results = state.demand_results(now)
            if demand is not None:
                results = demand.get(name, IntegratorResults(results.duration, 0.0, 0.0, 0.0, 0.0))
            state.stats.update(results)
            hwm = state.stats.high_watermark
            if state.exempt:
                current = max(state.min_cl, hwm)
                exempt_current[name] = current
                remaining -= current
            else:
                current = max(state.min_cl, min(state.nominal, hwm))
                index_of[name] = len(items)
                items.append(AllocItem(max(float(current), state.stats.smoothed), float(current), float(state.max_cl)))
                min_cl_sum += state.min_cl
                min_current_sum += current
        if not items and self.nominal_cl_sum > 0:
            log.error("impossible: no priority levels")
            return
        allocations: list[float] = []
        share_frac = fair_frac = 0.0
        failed = False
        if remaining <= min_cl_sum or remaining <= min_current_sum:
            if min_cl_sum < remaining <= min_current_sum:
                share_frac = (remaining - min_cl_sum) / (min_current_sum - min_cl_sum)
            self.metrics.fair_frac = 0.0
        else:
            try:
                allocations, fair_frac = compute_allocation(self.nominal_cl_sum, items)
            except AllocationError as err:
                failed = True
                log.error("unable to derive new concurrency limits", extra=fields(reason=str(err)))
                allocations = [float(levels[name].current_cl) for name in index_of]
            self.metrics.fair_frac = fair_frac
        for name, state in levels.items():
            index = index_of.get(name)
            if index is None:
                current = exempt_current[name]
            elif remaining <= min_cl_sum:
                current = state.min_cl
            elif remaining <= min_current_sum:
                minimum = max(state.min_cl, min(state.nominal, state.stats.high_watermark))
                current = state.min_cl + go_round((minimum - state.min_cl) * share_frac)
            else:
                current = go_round(allocations[index])
            if abs(current - state.current_cl) >= 0.05 * max(abs(current), abs(state.current_cl), 1) and not fresh_config:
                log.debug(
                    "priority level limit adjusted",
                    extra=fields(name=name, current=current, was=state.current_cl, backstop=failed),
                )
            state.current_cl = current
            stats = state.stats
            target = items[index if index is not None else 0].target if items else 0.0
            state.metrics.adjustment = (
                float(stats.high_watermark),
                stats.avg,
                stats.std_dev,
                stats.smoothed,
                target,
                current,
            )
            denominator = current if current > 0 else max(1, go_round(self.server_concurrency_limit / 10))
            state.metrics.set_denominators(now, demand=denominator)
            self.apply_limit(state, current, denominator)
        if standalone:
            for listener in self.listeners:
                listener()

    def apply_limit(self, state: Level, limit: int, denominator: int) -> None:
        """Set a level's queues to `limit` seats (worker processes use their share instead)."""
        state.queues.set_configuration(state.config, limit, denominator)

    # --- classification ---------------------------------------------------------------------------------

    def classify(self, user: UserInfo, info: RequestInfo) -> Schema:
        """The FlowSchema a request matches (`startRequest`'s loop)."""
        name, groups = user.name, user.groups
        both = self.by_user.get((name, groups))
        if both is None:
            both = self._candidates(user)
        known = self.decided.get(name)
        if known is None or known[0] != groups:  # (new, or the name's last request had other groups)
            self.decided[name] = (groups, _decision(both[1], user), _decision(both[0], user))
        candidates = both[0] if info.is_resource_request else both[1]
        if isinstance(candidates, Schema):  # the first schema that can match matches every such request
            return candidates
        for schema, tests in candidates:
            for test in tests:
                if test.request_matches(info):
                    return schema
        catch_all = self._catch_all
        assert catch_all is not None  # always supplied by _digest_schemas
        log.warning(
            "no FlowSchema matched a request; using catch-all",
            extra=fields(user=user.name, verb=info.verb, path=info.path),
        )
        return catch_all

    def _candidates(self, user: UserInfo) -> tuple[Candidates, Candidates]:
        """For resource requests, then for the others: the schemas (in order) and rules whose subjects
        the user passes and that can match such a request; just the first schema when one of its rules
        matches every such request."""
        name, groups = user.name, user.groups
        resource: list[tuple[Schema, tuple[RuleTest, ...]]] = []
        urls: list[tuple[Schema, tuple[RuleTest, ...]]] = []
        for schema in self.schemas:
            tests = [t for t in schema.rules if t.user_matches(name, groups)]
            for found, kind in ((resource, "resource"), (urls, "non_resource")):
                usable = tuple(t for t in tests if getattr(t, kind))
                if usable:
                    found.append((schema, usable))
        if len(self.by_user) >= _USER_CACHE:
            self.by_user.clear()
            self.decided.clear()
        both = (
            _shortest(resource, lambda t: t.every_resource),
            _shortest(urls, lambda t: t.every_url),
        )
        self.by_user[(name, groups)] = both
        return both

    # --- quiescing levels ----------------------------------------------------------------------------------

    def level_idle(self, level: Level) -> None:
        """`maybeReap`: a quiescing level that went idle is dropped by digesting again."""
        if not level.quiescing or self._reap_scheduled:
            return
        self._reap_scheduled = True

        def reap() -> None:
            self._reap_scheduled = False
            self.digest(*self._objects)

        self.call_later(0, reap)
