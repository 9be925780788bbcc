"""`--workers N`: N worker processes admit together what one kube-apiserver admits.

Each worker runs the whole of APF for its own requests (classification, fair queuing, seats), and
each priority level's current limit, computed once by the control process as one kube-apiserver
computes it (from the seat demand of every worker), is split among the workers: a worker may have
at most its *grant* of a level's seats in use, and the grants of a level never add up to more than
its limit. Dispatching stays local, so a request that finds a free seat in its worker's share
costs no message; only a level whose demand outgrows a worker's share moves seats:

- a worker whose demand for a limited level (seats in use + seats waiting) exceeds its grant, or
  falls back within it, reports the level's demand, its weight (the queues active there: fair
  queuing gives each active queue an equal share) and the seats it has in use (`SeatDemand`);
  reports are gathered once per turn of the event loop (an exempt level, never limited, reports
  none);
- the control process then divides the level's limit: what every worker asks for when it all fits
  (the rest spread evenly, so an idle worker can take a burst at once), otherwise max-min fair by
  weight, each worker capped at its demand, with fractions of a seat carried over between
  divisions so a limit smaller than the number of workers still alternates among them;
- a lower grant applies at once (the worker dispatches no more until it is under it); a higher one
  is granted only from seats no other worker still has in use, so the sum of the seats in use
  never passes the level's limit;
- every adjustment period each worker sends its seat-demand integrals (`SeatStats`); the control
  adds them up (the average exactly, the deviation as of independent demands, the high watermark
  as the sum of highs) for the borrowing adjustment.

The configuration objects reach the workers the same way (`ConfigUpdate`, sent on every change), and
a worker starts serving only once it holds them and its first grants.
"""

from __future__ import annotations

import asyncio
import logging
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.flowcontrol.controller import Controller, Level
from aggregator.flowcontrol.integrator import IntegratorResults, Moments, combine
from aggregator.flowcontrol.manifests import ConfigObjects
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

FIRST_GRANTS_TIMEOUT = 10.0


# --- the messages ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeatDemand:
    """Worker -> control: per level, (seats wanted, weight, seats in use), as of the grants numbered
    `seen` (the last the worker applied); `hello` on start."""

    levels: dict[str, tuple[int, int, int]]
    seen: int = 0
    hello: bool = False


@dataclass(frozen=True, slots=True)
class SeatGrants:
    """Control -> worker: the most seats of each level the worker may have in use (numbered)."""

    grants: dict[str, int]
    number: int = 0


@dataclass(frozen=True, slots=True)
class SeatStats:
    """Worker -> control: each level's seat demand integrals since the last ones (moments, min, max)."""

    levels: dict[str, tuple[Moments, float, float]]


@dataclass(frozen=True, slots=True)
class ConfigUpdate:
    """Control -> worker: the configuration objects, whole."""

    config: ConfigObjects


MESSAGES = (SeatDemand, SeatGrants, SeatStats, ConfigUpdate)


# --- the control's side ------------------------------------------------------------------------------------


@dataclass
class _Share:
    grant: int = 0
    demand: int = 0
    weight: int = 0
    in_use: int = 0
    credit: float = 0.0
    # The most seats the worker may have in use as far as the control knows: after a lower grant,
    # the old one until the worker reports from past it (`lowered`: the grants' number).
    held: int = 0
    lowered: int = 0
    pulsed: bool = False  # one more seat, for one dispatch, goes out with the next grants


@dataclass
class _Worker:
    send: Callable[[object], None]
    shares: dict[str, _Share] = field(default_factory=dict)
    greeted: bool = False
    stats: dict[str, tuple[Moments, float, float]] = field(default_factory=dict)
    sent: dict[str, int] | None = None  # the grants last sent
    number: int = 0  # of the grants last sent


def water_fill(limit: int, demands: list[int], weights: list[int]) -> list[float]:
    """`limit` seats shared max-min fairly by weight, no one getting more than its demand."""
    count = len(demands)
    exact = [0.0] * count
    left = float(limit)
    active = [i for i in range(count) if demands[i] > 0]
    while active and left > 1e-9:
        weight_sum = sum(max(weights[i], 1) for i in active)
        per_weight = left / weight_sum
        capped = [i for i in active if demands[i] - exact[i] <= per_weight * max(weights[i], 1)]
        if not capped:
            for i in active:
                exact[i] += per_weight * max(weights[i], 1)
            break
        for i in capped:
            left -= demands[i] - exact[i]
            exact[i] = float(demands[i])
        active = [i for i in active if i not in capped]
    return exact


def divide(limit: int, demands: list[int], weights: list[int], offset: int) -> tuple[list[int], list[float] | None]:
    """Each worker's steady share of `limit` seats, and under contention the fraction of a seat each
    one's fair share has beyond it (the seats left over are lent one dispatch at a time)."""
    count = len(demands)
    if count == 0 or limit <= 0:
        return [0] * count, None
    total = sum(demands)
    if total <= limit:
        spare = limit - total
        out = list(demands)
        for i in range(count):
            out[(offset + i) % count] += spare // count + (1 if i < spare % count else 0)
        return out, None
    exact = water_fill(limit, demands, weights)
    whole = [math.floor(x) for x in exact]
    return whole, [x - w for x, w in zip(exact, whole, strict=True)]


class SeatAllocator:
    """The control process's half: every worker's grants of every level."""

    def __init__(self, controller: Controller, config: Callable[[], ConfigObjects]) -> None:
        self.controller = controller
        self.config = config
        self.workers: dict[int, _Worker] = {}
        controller.listeners.append(self.rebalance_all)

    # --- the channels ---------------------------------------------------------------------------------

    def connect(self, index: int, send: Callable[[object], None]) -> None:
        self.workers[index] = _Worker(send)

    def disconnect(self, index: int) -> None:
        """A worker is gone: its seats are free."""
        if self.workers.pop(index, None) is not None:
            self.rebalance_all()

    def receive(self, index: int, message: object) -> bool:
        """A worker's message; True if it was one of ours."""
        worker = self.workers.get(index)
        if isinstance(message, SeatDemand):
            if worker is None:
                return True
            if message.hello:
                worker.greeted = True
                worker.send(ConfigUpdate(self.config()))
                self.rebalance_all(force=index)
                return True
            for name, (demand, weight, in_use) in message.levels.items():
                share = worker.shares.setdefault(name, _Share())
                share.demand, share.weight, share.in_use = demand, weight, in_use
                if message.seen >= share.lowered:
                    share.held = in_use
            for name in message.levels:
                self._rebalance(name)
            self._send()
            return True
        if isinstance(message, SeatStats):
            if worker is not None:
                for name, (moments, low, high) in message.levels.items():
                    kept = worker.stats.get(name)
                    worker.stats[name] = (
                        (kept[0] + moments, min(kept[1], low), max(kept[2], high)) if kept else (moments, low, high)
                    )
            return True
        return False

    def config_changed(self, config: ConfigObjects) -> None:
        for worker in self.workers.values():
            if worker.greeted:
                worker.send(ConfigUpdate(config))

    def demand(self) -> dict[str, IntegratorResults]:
        """Every worker's seat demand since the last adjustment, combined per level (then reset)."""
        per_level: dict[str, list[tuple[Moments, float, float]]] = {}
        for worker in self.workers.values():
            for name, part in worker.stats.items():
                per_level.setdefault(name, []).append(part)
            worker.stats = {}
        return {name: combine(parts) for name, parts in per_level.items()}

    # --- dividing -------------------------------------------------------------------------------------

    def rebalance_all(self, force: int | None = None) -> None:
        for name in self.controller.levels:
            self._rebalance(name)
        self._send(force)

    def _rebalance(self, name: str) -> None:
        level: Level | None = self.controller.levels.get(name)
        workers = [w for _, w in sorted(self.workers.items()) if w.greeted]
        if level is None or not workers:
            return
        shares = [w.shares.setdefault(name, _Share()) for w in workers]
        limit = max(level.current_cl, 0)
        offset = zlib.crc32(name.encode()) % len(workers)
        targets, fractions = divide(limit, [s.demand for s in shares], [s.weight for s in shares], offset)
        # Lower grants at once (the seats stay counted until the worker says it is under them);
        # higher ones only from seats no worker may still be using.
        committed = 0
        for worker, share, target in zip(workers, shares, targets, strict=True):
            if target < share.grant:
                share.held = max(share.held, share.grant)
                share.lowered = worker.number + 1  # the next grants sent to it carry the lower one
                share.grant = target
            committed += max(share.grant, share.held)
        free = limit - committed
        for share, target in zip(shares, targets, strict=True):
            if target > share.grant and free > 0:
                before = max(share.grant, share.held)
                share.grant = min(target, share.grant + free)
                free -= max(share.grant, share.held) - before
        if fractions is None:
            return
        # The seats beyond everyone's steady share, lent for one dispatch each to the worker whose
        # fractions of a seat add up to the most (deficit round robin among those that want more).
        while free > 0:
            wanting = [i for i, sh in enumerate(shares) if sh.demand > max(sh.grant, sh.held) and not sh.pulsed]
            if not wanting:
                break
            for i in wanting:
                shares[i].credit += fractions[i]
            chosen = max(wanting, key=lambda i: (shares[i].credit, -((i - offset) % len(shares))))
            share = shares[chosen]
            share.credit -= 1
            share.pulsed = True
            before = max(share.grant, share.held)
            share.held = max(share.held, share.grant + 1)
            free -= max(share.grant, share.held) - before

    def _send(self, force: int | None = None) -> None:
        levels = self.controller.levels
        for index, worker in self.workers.items():
            if not worker.greeted:
                continue
            grants = {name: share.grant for name, share in worker.shares.items() if name in levels}
            pulsed = [name for name, share in worker.shares.items() if share.pulsed and name in levels]
            if pulsed:
                # One more seat, then back: the worker dispatches one request with it, and the seat
                # counts as its own until it reports from past the second grants.
                worker.number += 1
                worker.send(SeatGrants({**grants, **{n: grants[n] + 1 for n in pulsed}}, worker.number))
                for name in pulsed:
                    worker.shares[name].pulsed = False
                    worker.shares[name].lowered = worker.number + 1
                worker.sent = None
            if grants != worker.sent or index == force:
                worker.number += 1
                worker.send(SeatGrants(grants, worker.number))
                worker.sent = grants


# --- the worker's side ---------------------------------------------------------------------------------


class SeatShare:
    """A worker's half: its grants applied to its levels, its demand reported when it outgrows them."""

    def __init__(self, controller: Controller, send: Callable[[object], None]) -> None:
        self.controller = controller
        self.send = send
        self.grants: dict[str, int] = {}
        self.seen = 0  # the number of the grants applied
        self.config: ConfigObjects | None = None
        self.ready = asyncio.Event()
        self._granted = False
        self._over: dict[str, bool] = {}
        self._last: dict[str, tuple[int, int, int]] = {}
        self._dirty: set[str] = set()
        self._flush_scheduled = False
        self.config_listeners: list[Callable[[ConfigObjects], None]] = []
        controller.apply_limit = self._apply_limit  # type: ignore[method-assign]
        controller.listeners.append(self._hook_levels)
        self._hook_levels()

    # --- from the control ---------------------------------------------------------------------------------

    def receive(self, message: object) -> bool:
        if isinstance(message, ConfigUpdate):
            self.config = message.config
            for listener in self.config_listeners:
                listener(message.config)
            self._check_ready()
            return True
        if isinstance(message, SeatGrants):
            for name, grant in message.grants.items():
                if grant < self.grants.get(name, 0):
                    self._dirty.add(name)  # the control waits to hear these seats are free
                    self._last.pop(name, None)
            self.grants = dict(message.grants)
            self.seen = message.number
            self._granted = True
            for level in self.controller.levels.values():
                self._apply_limit(level, level.current_cl, self._denominator(level))
            if self._dirty and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            self._check_ready()
            return True
        return False

    def _check_ready(self) -> None:
        if self._granted and self.config is not None:
            self.ready.set()

    def hello(self) -> None:
        self.send(SeatDemand({}, hello=True))

    # --- applying grants ------------------------------------------------------------------------------------

    def _denominator(self, level: Level) -> int:
        current = level.current_cl
        return current if current > 0 else max(1, round(self.controller.server_concurrency_limit / 10))

    def _apply_limit(self, state: Level, limit: int, denominator: int) -> None:
        """`Controller.apply_limit` in a worker: the grant, not the level's whole limit."""
        level = state
        level.queues.set_configuration(level.config, self.grants.get(level.name, 0), denominator)
        self._noted(level)

    # --- reporting demand ---------------------------------------------------------------------------------------

    def _hook_levels(self) -> None:
        """Watch every limited level's seat demand (levels are created on configuration changes).
        An exempt level dispatches whatever its grant, so its demand is not reported: that was two
        messages and a wake-up of the control per change of its seats in use, i.e. per request of
        system:masters. Its integrals still go out with `stats`, for the borrowing."""
        for level in self.controller.levels.values():
            if level.exempt:
                level.queues.on_demand = None
            elif level.queues.on_demand is None:
                level.queues.on_demand = lambda _demand, level=level: self._noted(level)

    def _noted(self, level: Level) -> None:
        queues = level.queues
        wanted = queues.seats_in_use + queues.waiting_seats
        grant = self.grants.get(level.name, 0)
        over = wanted > grant
        if over or self._over.get(level.name, False):
            self._over[level.name] = over
            self._dirty.add(level.name)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        report: dict[str, tuple[int, int, int]] = {}
        for name in self._dirty:
            level = self.controller.levels.get(name)
            if level is None or level.exempt:
                continue  # gone, or never limited (a lower grant or a new limit noted it)
            queues = level.queues
            wanted = queues.seats_in_use + queues.waiting_seats
            weight = max(queues.active_queues, 1) if wanted else 0
            entry = (wanted, weight, queues.seats_in_use)
            if self._last.get(name) != entry:
                self._last[name] = entry
                report[name] = entry
        self._dirty.clear()
        if report:
            self.send(SeatDemand(report, self.seen))

    def stats(self, now: float) -> SeatStats:
        """Each level's seat-demand integrals since the last call (the periods start over)."""
        return SeatStats({name: level.demand_moments(now) for name, level in self.controller.levels.items()})


async def wait_ready(share: SeatShare, patience: float = FIRST_GRANTS_TIMEOUT) -> None:
    """Until the control process sent the configuration and the first grants (bounded: a worker
    without them queues its requests until they come)."""
    try:
        async with asyncio.timeout(patience):
            await share.ready.wait()
    except TimeoutError:
        log.warning(
            "no API Priority and Fairness grants from the control process yet; requests wait for them",
            extra=fields(waited_seconds=patience),
        )
