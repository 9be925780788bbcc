"""One priority level's fair queuing: `k8s.io/apiserver/pkg/util/flowcontrol/fairqueuing/queueset`.

Upstream's algorithm, state and numbers (see its `doc.go`): virtual time R advances at
`min(seats requested, concurrency limit) / active queues` seat-seconds per second; a request is
shuffle-sharded into the least loaded queue of its flow's hand, refused when the level is at its
concurrency limit and that queue at its length limit, and dispatched from the queue whose head
has the earliest virtual finish (`nextDispatchR + work`, round-robin order breaking ties), with
every dispatch charged an estimated 3 ms service time that is corrected by the real one when the
request finishes, and the anti-windup bound (a queue's dispatch R never precedes its head's
arrival). Seats: a request occupies max(initial, final) seats while it executes, the final ones
for `AdditionalLatency` longer; one wider than the limit runs when nothing else does. An exempt
level (no queues desired, negative) never waits; a Reject level (zero queues) dispatches or
refuses at once. R is kept in upstream's fixed point (1e-8 seat-seconds) as a Python int: it cannot
overflow, so upstream's epoch advance never happens here.

Single-threaded (the event loop): upstream's lock is not needed, and a queued request waits on a
future. What upstream recomputes by walking every queue (the virtual-time rate, the dispatch
choice) is kept incrementally or computed over the non-empty queues only, with the same result.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aggregator.flowcontrol.metrics import SS_SCALE, FlowStats, LevelMetrics, level_state
from aggregator.flowcontrol.shufflesharding import Dealer

ESTIMATED_SERVICE_DURATION = 0.003
_G_WORK = round(ESTIMATED_SERVICE_DURATION * SS_SCALE)  # one seat for G
_HAND_CACHE = 4096
_new_request = object.__new__


def seats_times_duration(seats: float, seconds: float) -> int:
    """`SeatsTimesDuration` in fixed point."""
    return round(seats * seconds * SS_SCALE)


@dataclass(frozen=True, slots=True)
class WorkEstimate:
    """`request.WorkEstimate`."""

    initial_seats: int = 1
    final_seats: int = 0
    additional_latency: float = 0.0  # seconds

    @property
    def max_seats(self) -> int:
        return self.initial_seats if self.initial_seats >= self.final_seats else self.final_seats


ONE_SEAT = WorkEstimate()


class QueueNote(Protocol):
    """Told when a request enters and leaves its queue (`fq.QueueNoteFn`), or passes through it in
    one instant (`passed`: dispatched as it arrived)."""

    def queued(self) -> None: ...

    def dequeued(self) -> None: ...

    def passed(self, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class QueuingConfig:
    """`fq.QueuingConfig`: -1 queues for an exempt level, 0 for Reject."""

    name: str
    desired_queues: int = 0
    queue_length_limit: int = 0
    hand_size: int = 0


class Request:
    """A request in a queueset, from arrival to the release of its last seat; the filter keeps what
    it decided about the request on it too (`schema`, `lane`, `watch`, `forget_watch`).

    This class itself is the commonest request of all, one seat dispatched as it arrived
    (`start_one`): its size and queuing fields are the class's defaults, so making one sets only
    what differs between such requests. Every other request is a `SizedRequest`, which holds its own."""

    __slots__ = (
        "arrival_r",
        "executing",
        "final_seats",
        "forget_watch",
        "initial_seats",
        "lane",
        "max_seats",
        "queue",
        "schema",
        "start",
        "stats",
        "watch",
    )

    # Never queued, its work one seat's: a `SizedRequest` holds these itself. (What `finish` reads
    # is held by every request: a slot is read faster than a class's default.)
    additional_latency: float = 0.0  # seconds
    total_work: int = _G_WORK
    # Queued: the future the caller waits on (True: dispatched); None once decided.
    decided: asyncio.Future[bool] | None = None
    waiting: bool = False
    queued_note: QueueNote | None = None

    stats: FlowStats  # its FlowSchema's series in its level
    initial_seats: int
    final_seats: int
    max_seats: int
    arrival_r: int
    queue: Queue | None
    start: float
    executing: bool  # holds seats: `finish` must be called
    schema: Any
    lane: Any  # its kind's counters in the filter
    watch: bool
    forget_watch: Callable[[], None] | None


class SizedRequest(Request):
    """Any request but a one seat one dispatched as it arrived: its seats, its work, its place in a queue."""

    __slots__ = ("additional_latency", "decided", "queued_note", "total_work", "waiting")

    def __init__(self, stats: FlowStats, work: WorkEstimate, total_work: int, arrival_r: int) -> None:
        self.stats = stats
        self.initial_seats = work.initial_seats
        self.final_seats = work.final_seats
        self.additional_latency = work.additional_latency
        self.max_seats = work.max_seats
        self.total_work = total_work
        self.arrival_r = arrival_r
        self.queue = None
        self.start = 0.0
        self.decided = None
        self.waiting = False
        self.executing = False
        self.queued_note = None
        self.schema = None
        self.lane = None
        self.watch = False
        self.forget_watch = None


class Queue:
    __slots__ = ("executing", "index", "next_dispatch_r", "seats_in_use", "waiting", "waiting_max_seats", "waiting_work")

    def __init__(self, index: int) -> None:
        self.index = index
        self.waiting: deque[SizedRequest] = deque()
        self.waiting_max_seats = 0
        self.waiting_work = 0
        self.next_dispatch_r = 0
        self.executing = 0
        self.seats_in_use = 0


class QueueSet:
    """One priority level's queues (upstream's `queueSet`)."""

    def __init__(
        self,
        config: QueuingConfig,
        metrics: LevelMetrics,
        *,
        clock: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], object],
        shortcuts: bool = True,
    ) -> None:
        self.clock = clock
        # False: every request goes through its queue as upstream's code does (tests compare the two).
        self.shortcuts = shortcuts
        self.call_later = call_later
        self.metrics = metrics
        metrics.queues = self  # R is read from here when scraped
        # Told of the seat demand (seats in use + seats waiting) when it changes (--workers' shares).
        self.on_demand: Callable[[int], None] | None = None
        self.config = QueuingConfig(config.name)
        self.concurrency_limit = 0
        self.dealer: Dealer | None = None
        self.queues: list[Queue] = []
        self.current_r = 0
        self.last_real = clock()
        self.robin_index = 0
        self.enqueues = 0
        self.waiting_requests = 0
        self.waiting_seats = 0
        self.executing_requests = 0
        self.seats_in_use = 0
        # Incremental forms of what getVirtualTimeRatioLocked sums over the queues.
        self._active_queues = 0
        self._seats_requested = 0
        self._nonempty: set[int] = set()  # queues with requests waiting
        self._hands: dict[int, list[int]] = {}
        self._demand = 0
        # Finishing skips the dispatch pass when nothing waits (not while surplus queues drain).
        self._plain = False
        self._fast = 0
        self._hand_size = 0
        self.rejected = 0
        self.timed_out = 0
        self.set_configuration(config, 0, 1)

    # --- configuration ------------------------------------------------------------------------------

    def set_configuration(self, config: QueuingConfig, concurrency_limit: int, denominator: int) -> None:
        """`setConfiguration`: more queues at once, fewer by attrition; a Reject or exempt level keeps
        its last queuing parameters."""
        now = self.clock()
        self._sync_time(now)
        if config.desired_queues > 0:
            if config.desired_queues > len(self.queues):
                start = len(self.queues)
                self.queues.extend(Queue(start + i) for i in range(config.desired_queues - start))
            dealer = Dealer(config.desired_queues, config.hand_size)
        else:
            config = QueuingConfig(
                config.name, config.desired_queues, self.config.queue_length_limit, self.config.hand_size
            )
            dealer = None
        if dealer is None or self.dealer is None or (dealer.deck_size, dealer.hand_size) != (
            self.dealer.deck_size,
            self.dealer.hand_size,
        ):
            self._hands = {}
        self.config = config
        self.dealer = dealer
        self._hand_size = config.hand_size
        # The kind of level `start_one` serves: 1 queuing, -1 exempt, 0 none (Reject; no shortcuts).
        self._fast = 0 if not self.shortcuts or config.desired_queues == 0 else 1 if config.desired_queues > 0 else -1
        self.concurrency_limit = concurrency_limit
        qll = max(config.queue_length_limit, 1)
        if config.desired_queues > 0:
            qll *= config.desired_queues
        self.metrics.set_denominators(now, waiting=qll, executing=denominator)
        self._plain = self.shortcuts and len(self.queues) <= config.desired_queues
        self._dispatch_as_much_as_possible(now)
        self._settle(now)

    @property
    def exempt(self) -> bool:
        return self.config.desired_queues < 0

    @property
    def active_queues(self) -> int:
        """Queues with requests waiting or executing (what divides R's advance)."""
        return self._active_queues

    def is_idle(self) -> bool:
        return self.waiting_requests == 0 and self.executing_requests == 0

    # --- virtual time --------------------------------------------------------------------------------

    def _sync_time(self, now: float) -> None:
        """`syncTimeLocked`: R advances for the time since the last change, at the rate the state
        in effect since then gave it."""
        elapsed = now - self.last_real
        self.last_real = now
        active = self._active_queues
        if active and elapsed > 0:
            requested = self._seats_requested
            limit = self.concurrency_limit
            rate = (requested if requested < limit else limit) / active
            self.current_r += round(rate * elapsed * SS_SCALE)

    def _settle(self, now: float) -> None:
        """After every change: the new state for the timing histograms and the seat demand's
        integrals (`StateClock.note`, inlined: this runs twice per request), its extremes."""
        seats = self.seats_in_use
        demand = seats + self.waiting_seats
        m = self.metrics
        clock = m.state
        elapsed = now - clock.since
        if elapsed > 0:
            times = clock.times
            previous = clock.state
            times[previous] = times.get(previous, 0.0) + elapsed
            clock.since = now
        clock.state = level_state(self.waiting_requests, self.executing_requests, seats, demand)
        if demand != self._demand:
            self._demand = demand
            if demand > m.demand_max:
                m.demand_max = demand
            elif demand < m.demand_min:
                m.demand_min = demand
            if self.on_demand is not None:
                self.on_demand(demand)

    def _queue_state_changed(self, queue: Queue, was_active: bool) -> None:
        active = bool(queue.waiting) or queue.executing > 0
        if active != was_active:
            self._active_queues += 1 if active else -1

    # --- arrival --------------------------------------------------------------------------------------

    def start_request(
        self,
        work: WorkEstimate,
        hash_value: int,
        stats: FlowStats,
        queued_note: QueueNote | None = None,
    ) -> Request | None:
        """`StartRequest`: a dispatched request (`decided` None), a queued one (await `wait`), or
        None: rejected (the reason is counted)."""
        now = self.clock()
        self._sync_time(now)
        if self.config.desired_queues < 1:
            if not self._can_accommodate(work.max_seats):
                self.rejected += 1
                stats.reject("concurrency-limit")
                return None
            request = SizedRequest(stats, work, self._total_work(work), self.current_r)
            self._execute(request, None, now)
            self._settle(now)
            return request
        queue = self.queues[self._shuffle_shard(hash_value)]
        request = SizedRequest(stats, work, self._total_work(work), self.current_r)
        request.queue = queue
        if (
            self.shortcuts
            and not self.waiting_requests
            and self.seats_in_use < self.concurrency_limit
            and self._can_accommodate(request.max_seats)
        ):
            # Nothing waits and it fits: upstream enqueues it and dispatches it in the same instant;
            # the same state results without the queue's round trip.
            self._dispatch_at_once(request, queue, queued_note, now)
            self._settle(now)
            return request
        if self.seats_in_use >= self.concurrency_limit and len(queue.waiting) >= self.config.queue_length_limit:
            self._bound_next_dispatch(queue)
            self.rejected += 1
            stats.reject("queue-full")
            return None
        request.queued_note = queued_note
        self._enqueue(request, queue, now)
        self._bound_next_dispatch(queue)
        stats.queue_length.observe(len(queue.waiting))
        self._dispatch_as_much_as_possible(now)
        if request.waiting:
            request.decided = asyncio.get_running_loop().create_future()
        self._settle(now)
        return request

    def start_one(self, hash_value: int, stats: FlowStats) -> Request | None:
        """`start_request` for the common case, in one step: a one-seat request of an exempt level, or
        of a queuing level where nothing waits and a seat is free (what `_dispatch_at_once` does,
        inlined: this runs for nearly every request). None when it is not that case. The caller
        sets what it decided (`schema`, `lane`, `watch`) and tells the waiting watermark that a
        queued level's request passed through its queue."""
        fast = self._fast
        seats = self.seats_in_use
        if fast > 0:
            if self.waiting_requests or seats >= self.concurrency_limit:
                return None
        elif not fast:
            return None
        now = self.clock()
        r = self.current_r
        active = self._active_queues
        if active:  # _sync_time, inlined
            elapsed = now - self.last_real
            if elapsed > 0:
                requested = self._seats_requested
                limit = self.concurrency_limit
                r = self.current_r = r + round((requested if requested < limit else limit) / active * elapsed * SS_SCALE)
        self.last_real = now
        request = _new_request(Request)  # its queuing fields are the class's
        request.stats = stats
        request.initial_seats = request.max_seats = 1
        request.final_seats = 0
        request.arrival_r = r
        request.start = now
        request.forget_watch = None
        request.executing = True
        stats.executing_requests += 1
        stats.executing_seats += 1
        executing = self.executing_requests = self.executing_requests + 1
        self.seats_in_use = seats = seats + 1
        m = self.metrics
        if fast < 0:  # exempt: no queue
            request.queue = None
            stats.fast_exempt += 1
        else:
            stats.fast += 1
            hand = self._hands.get(hash_value)
            if hand is None:
                hand = self._deal(hash_value)
            enqueues = self.enqueues
            queue = request.queue = self.queues[hand[enqueues % self._hand_size]]
            self.enqueues = enqueues + 1
            before = queue.executing
            if before:
                start = queue.next_dispatch_r
                if start < r:  # the anti-windup bound
                    start = r
            else:
                start = r
                self._active_queues = active + 1
            self.robin_index = queue.index
            in_use = queue.seats_in_use
            discounted = start - in_use * _G_WORK
            m.dispatch = (r, start, start, start, discounted, discounted)
            queue.executing = before + 1
            queue.seats_in_use = in_use + 1
            self._seats_requested += 1
            queue.next_dispatch_r = start + _G_WORK
        # _settle, inlined (nothing waits: the demand is the seats in use, one more than it was)
        clock = m.state
        elapsed = now - clock.since
        if elapsed > 0:
            times = clock.times
            previous = clock.state
            try:
                times[previous] += elapsed
            except KeyError:
                times[previous] = elapsed
            clock.since = now
        clock.state = seats if executing == seats else (0, executing, seats, seats)  # level_state
        self._demand = seats
        if seats > m.demand_max:
            m.demand_max = seats
        if self.on_demand is not None:
            self.on_demand(seats)
        return request

    def _deal(self, hash_value: int) -> list[int]:
        assert self.dealer is not None
        if len(self._hands) >= _HAND_CACHE:
            self._hands.clear()
        hand = self._hands[hash_value] = self.dealer.deal(hash_value)
        return hand

    def _dispatch_at_once(
        self, request: SizedRequest, queue: Queue, queued_note: QueueNote | None, now: float
    ) -> None:
        """Enqueue and dispatch as one step (`enqueueToBoundLocked` then `dispatchLocked` finding this
        queue, the only one with a request waiting)."""
        if queue.waiting or queue.executing:
            if queue.next_dispatch_r < request.arrival_r:  # the anti-windup bound
                queue.next_dispatch_r = request.arrival_r
        else:
            queue.next_dispatch_r = self.current_r
        m = self.metrics
        stats = request.stats
        stats.queued = True  # upstream's +1 and -1 leave the in-queue series at 0
        if queued_note is not None:
            queued_note.passed(now)
        stats.passed += 1  # the queue's length after enqueue: 1
        limit = self.concurrency_limit
        if request.final_seats > limit:
            self._shrink_final_seats(request, limit)
        self.robin_index = queue.index
        start = queue.next_dispatch_r
        discounted = start - queue.seats_in_use * _G_WORK
        m.dispatch = (self.current_r, start, start, start, discounted, discounted)
        self._execute(request, queue, now)
        queue.next_dispatch_r = start + request.total_work

    @staticmethod
    def _shrink_final_seats(request: SizedRequest, limit: int) -> None:
        """Final seats beyond the limit: as many as the limit, for as long as keeps the work the same."""
        final_work = request.total_work - _G_WORK * request.initial_seats
        request.additional_latency = final_work / limit / SS_SCALE if limit > 0 else math.inf
        request.final_seats = limit

    def _total_work(self, work: WorkEstimate) -> int:
        initial = _G_WORK * work.initial_seats
        if work.final_seats and work.additional_latency > 0:
            return initial + seats_times_duration(work.final_seats, work.additional_latency)
        return initial

    def _shuffle_shard(self, hash_value: int) -> int:
        """`shuffleShardLocked`: the least loaded queue (by waiting work) of the flow's hand, visited
        from a rotating offset."""
        hand = self._hands.get(hash_value)
        if hand is None:
            hand = self._deal(hash_value)
        size = len(hand)
        offset = self.enqueues % size
        self.enqueues += 1
        if not self.waiting_requests:
            return hand[offset]  # every queue's waiting work is 0: the first one visited
        queues = self.queues
        best = -1
        least = math.inf
        for i in range(size):
            index = hand[(offset + i) % size]
            work = queues[index].waiting_work
            if work < least:
                least = work
                best = index
        return best

    def _enqueue(self, request: SizedRequest, queue: Queue, now: float) -> None:
        was_active = bool(queue.waiting) or queue.executing > 0
        if not was_active:
            queue.next_dispatch_r = self.current_r
        queue.waiting.append(request)
        request.waiting = True
        queue.waiting_max_seats += request.max_seats
        queue.waiting_work += request.total_work
        self._seats_requested += request.max_seats
        self._nonempty.add(queue.index)
        self._queue_state_changed(queue, was_active)
        self.waiting_requests += 1
        self.waiting_seats += request.max_seats
        stats = request.stats
        stats.inqueue_requests += 1
        stats.inqueue_seats += request.max_seats
        stats.queued = True
        if request.queued_note is not None:
            request.queued_note.queued()

    def _remove_waiting(self, request: SizedRequest, queue: Queue) -> None:
        """Take a waiting request out of its queue (dispatched or timed out)."""
        was_active = True
        if queue.waiting and queue.waiting[0] is request:
            queue.waiting.popleft()
        else:
            queue.waiting.remove(request)
        request.waiting = False
        queue.waiting_max_seats -= request.max_seats
        queue.waiting_work -= request.total_work
        self._seats_requested -= request.max_seats
        if not queue.waiting:
            self._nonempty.discard(queue.index)
        self._queue_state_changed(queue, was_active)
        self.waiting_requests -= 1
        self.waiting_seats -= request.max_seats

    def _bound_next_dispatch(self, queue: Queue) -> None:
        """The anti-windup hack: a queue's dispatch R never precedes its oldest request's arrival."""
        if queue.waiting:
            bound = queue.waiting[0].arrival_r
            if queue.next_dispatch_r < bound:
                queue.next_dispatch_r = bound

    # --- dispatch -------------------------------------------------------------------------------------

    def _can_accommodate(self, seats: int) -> bool:
        if self.config.desired_queues < 0:
            return True
        limit = self.concurrency_limit
        if seats > limit:
            return self.executing_requests == 0
        return self.seats_in_use + seats <= limit

    def _dispatch_as_much_as_possible(self, now: float) -> None:
        while self.waiting_requests and self.seats_in_use < self.concurrency_limit and self._dispatch(now):
            pass

    def _dispatch(self, now: float) -> bool:
        """`dispatchLocked` with `findDispatchQueueToBoundLocked`: the head with the earliest virtual
        finish, the first in round-robin order after the last queue dispatched from."""
        queues = self.queues
        nq = len(queues)
        robin = self.robin_index
        best: Queue | None = None
        best_key: tuple[int, int] | None = None
        s_min = d_min = math.inf
        s_max = d_max = -math.inf
        g = _G_WORK
        for index in self._nonempty:
            queue = queues[index]
            start = queue.next_dispatch_r
            discounted = start - queue.seats_in_use * g
            s_min = min(s_min, start)
            s_max = max(s_max, start)
            d_min = min(d_min, discounted)
            d_max = max(d_max, discounted)
            key = (start + queue.waiting[0].total_work, (index - robin - 1) % nq)
            if best_key is None or key < best_key:
                best_key, best = key, queue
        if best is None:
            return False
        request = best.waiting[0]
        m = self.metrics
        if not self._can_accommodate(request.max_seats):
            request.stats.no_accommodation += 1
            return False
        self._remove_waiting(request, best)
        limit = self.concurrency_limit
        if request.final_seats > limit:
            self._shrink_final_seats(request, limit)
        self.robin_index = best.index
        m.dispatch = (self.current_r, best.next_dispatch_r, int(s_min), int(s_max), int(d_min), int(d_max))
        stats = request.stats
        stats.inqueue_requests -= 1
        stats.inqueue_seats -= request.max_seats
        if request.queued_note is not None:
            request.queued_note.dequeued()
        self._execute(request, best, now)
        best.next_dispatch_r += request.total_work
        self._bound_next_dispatch(best)
        decided = request.decided
        if decided is not None and not decided.done():
            decided.set_result(True)
        return True

    def _execute(self, request: Request, queue: Queue | None, now: float) -> None:
        request.start = now
        request.executing = True
        seats = request.max_seats
        self.executing_requests += 1
        self.seats_in_use += seats
        if queue is not None:
            was_active = bool(queue.waiting) or queue.executing > 0
            queue.executing += 1
            queue.seats_in_use += seats
            self._seats_requested += seats
            self._queue_state_changed(queue, was_active)
        stats = request.stats
        stats.executing_requests += 1
        stats.executing_seats += seats
        stats.executed = True

    # --- waiting ----------------------------------------------------------------------------------------

    async def wait(self, request: Request, patience: float) -> bool:
        """Wait up to `patience` seconds for the request's dispatch: True to execute, False when it was
        taken out of its queue (counted as a `time-out` rejection). Cancelled (the client went away),
        it leaves its queue; if it was dispatched in the same instant, `request.executing` says so and
        the caller must still `finish` it."""
        decided = request.decided
        if decided is None:
            return True
        try:
            async with asyncio.timeout(patience if patience > 0 else 0):
                return await decided
        except TimeoutError:
            pass
        finally:
            if request.waiting:
                self.cancel(request)
        return request.executing

    def cancel(self, request: Request) -> None:
        """A queued request whose wait ended (its deadline, or the client went away): out of its queue."""
        if not request.waiting or request.queue is None:
            return
        assert isinstance(request, SizedRequest)  # (only they wait)
        now = self.clock()
        self._sync_time(now)
        queue = request.queue
        self._remove_waiting(request, queue)
        self._bound_next_dispatch(queue)
        self.rejected += 1
        self.timed_out += 1
        stats = request.stats
        stats.reject("time-out")
        stats.inqueue_requests -= 1
        stats.inqueue_seats -= request.max_seats
        if request.queued_note is not None:
            request.queued_note.dequeued()
        self._settle(now)
        decided = request.decided
        if decided is not None and not decided.done():
            decided.set_result(False)
        request.decided = None

    # --- the end ------------------------------------------------------------------------------------------

    def finish(self, request: Request, now: float | None = None) -> None:
        """`finishRequestAndDispatchAsMuchAsPossible`: the request is done executing (its final seats,
        if any, linger for its additional latency), and whatever fits now is dispatched. Where nothing
        waits and no seat lingers (the common case) that is written out inline."""
        if not request.executing:
            return
        request.executing = False
        if now is None:
            now = self.clock()
        queue = request.queue
        if queue is None or not self._plain or request.final_seats or self.waiting_requests:
            self._finish(request, now)
            return
        active = self._active_queues  # (its queue is one)
        elapsed = now - self.last_real
        self.last_real = now
        if elapsed > 0:
            requested = self._seats_requested
            limit = self.concurrency_limit
            self.current_r += round((requested if requested < limit else limit) / active * elapsed * SS_SCALE)
        seats = request.max_seats
        stats = request.stats
        stats.executing_requests -= 1
        stats.executing_seats -= seats
        executing_requests = self.executing_requests = self.executing_requests - 1
        self.seats_in_use = in_use = self.seats_in_use - seats
        executing = queue.executing = queue.executing - 1
        # the queue's dispatch R corrected by the real service time (no request waits: no bound)
        queue.next_dispatch_r -= round(request.initial_seats * (ESTIMATED_SERVICE_DURATION - (now - request.start)) * SS_SCALE)
        queue.seats_in_use -= seats
        self._seats_requested -= seats
        if not executing:
            self._active_queues = active - 1
        # _settle, inlined (nothing waits: the demand is the seats in use, fewer than it was)
        m = self.metrics
        clock = m.state
        elapsed = now - clock.since
        if elapsed > 0:
            times = clock.times
            previous = clock.state
            try:
                times[previous] += elapsed
            except KeyError:
                times[previous] = elapsed
            clock.since = now
        clock.state = in_use if executing_requests == in_use else (0, executing_requests, in_use, in_use)
        self._demand = in_use
        if in_use < m.demand_min:
            m.demand_min = in_use
        if self.on_demand is not None:
            self.on_demand(in_use)

    def _finish(self, request: Request, now: float) -> None:
        self._sync_time(now)
        self.executing_requests -= 1
        request.stats.executing_requests -= 1
        queue = request.queue
        if queue is not None:
            was_active = bool(queue.waiting) or queue.executing > 0
            queue.executing -= 1
            service = now - request.start
            queue.next_dispatch_r -= seats_times_duration(
                request.initial_seats, ESTIMATED_SERVICE_DURATION - service
            )
            self._bound_next_dispatch(queue)
            self._queue_state_changed(queue, was_active)
        if request.additional_latency <= 0 or request.final_seats == 0:
            self._release(request, now)
        else:
            self.call_later(request.additional_latency, lambda: self._linger_over(request))
        self._dispatch_as_much_as_possible(now)
        self._settle(now)

    def _linger_over(self, request: Request) -> None:
        now = self.clock()
        self._sync_time(now)
        self._release(request, now)
        self._dispatch_as_much_as_possible(now)
        self._settle(now)

    def _release(self, request: Request, now: float) -> None:
        seats = request.max_seats
        self.seats_in_use -= seats
        request.stats.executing_seats -= seats
        queue = request.queue
        if queue is not None:
            queue.seats_in_use -= seats
            self._seats_requested -= seats
            self._remove_if_surplus(queue)

    def _remove_if_surplus(self, queue: Queue) -> None:
        """`removeQueueIfEmptyLocked`: queues beyond the desired number go once empty."""
        if len(self.queues) <= self.config.desired_queues or queue.waiting or queue.executing:
            return
        if queue.seats_in_use:
            return
        index = queue.index
        if index >= len(self.queues) or self.queues[index] is not queue:
            return
        del self.queues[index]
        self._plain = self.shortcuts and len(self.queues) <= self.config.desired_queues
        self._nonempty = {i - 1 if i > index else i for i in self._nonempty}
        for later in self.queues[index:]:
            later.index -= 1
        if self.robin_index >= index:
            self.robin_index -= 1
        self._hands = {}
