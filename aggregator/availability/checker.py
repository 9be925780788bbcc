"""`gateway.control.availability`: every APIService re-checked on a timer and on change; the proxy asks it.

One loop per APIService on the shared engine (`util/loops.py`), at most `workers` checks at a time
(upstream runs 5 workers): a check at
start (once the store has synced), every `interval` seconds (30 s, upstream's resync), at once
when the APIService's spec, its Service or its EndpointSlices change, sooner after a failed
discovery GET (doubling from `retry_initial` up to `interval`, like upstream's rate-limited
requeue), and at once when the proxy `suspect`s it (a proxied request failed to connect or to
complete TLS, or was refused because the APIService is unavailable), at most once a second per
APIService: a backend that dies is marked unavailable, and one that comes back available again,
within about a second of a client noticing, where upstream waits for its 30 s resync. A
status-only change of the APIService (our own write, or kube-apiserver's aggregator)
does not trigger a check.

The latest verdict answers `is_available` (the proxy's 503 `service unavailable`) straight from a
dict; before an APIService's first verdict the object's own condition answers, as upstream's proxy
reads it. Every verdict sets `aggregator_unavailable_apiservice{name}`; a recorded flip to
not-available counts `aggregator_unavailable_apiservice_total{name,reason}`; a deleted APIService
loses its gauge series. Listeners (discovery's fetcher) hear of every flip, so a backend found
down is re-fetched, and its discovery marked Stale, at once.

A backend the last check could not reach at all (`unreachable`: no Service, port or endpoint, a
refused or hung connection, a failed handshake) is the one verdict the discovery fetcher and the
OpenAPI downloads go by: they do not dial it until a check reaches it again, and hear of that at
once. Nor do they dial an APIService before its first verdict (`awaiting_check`): at start-up the
checks go first, and the fetches that follow each verdict find its connection idle. Its own next check makes one GET instead of hedging with five: the backend was just found
down, and a dead one then costs one dial per retry (at most every `interval`, jittered).

`/readyz?verbose` names every unavailable APIService and every endpoint the proxy holds ejected:
those lines (`notes`, a `NoteBoard`) are set as each verdict or ejection comes in, never rebuilt
from every APIService, and verdict listeners hear of every changed verdict (a worker process
mirrors both through `workers/publisher.py`).

Readiness (`/readyz` check `apiservice-availability-synced`) waits for the first round: every
APIService present when the store synced has a first verdict, whatever it is. Until then the
proxy would answer from the objects' own (possibly stale, or absent) conditions, so a freshly
started replica taken into its Service could turn working group-versions away with 503 `service
unavailable`. A dead backend only delays readiness by one probe timeout: any verdict counts, and
after the probe timeout plus a second the check passes whatever is still pending (a queue of
many hanging backends must not keep the gateway out of its Service). It never fails again.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from aggregator.availability import conditions as cond
from aggregator.availability.conditions import Verdict
from aggregator.availability.ejections import EjectionBook
from aggregator.availability.metrics import AvailabilityMetrics
from aggregator.availability.probe import AccessError, DiscoveryProbe, Report, check_apiservice
from aggregator.availability.quarantine import DiscoveryQuarantine
from aggregator.availability.status import Change, StatusSink
from aggregator.backends.bounds import read_bounds
from aggregator.model.apiservice import APIService, Condition
from aggregator.sources.store import DELETED, MODIFIED, Event, Store
from aggregator.util.logs import fields
from aggregator.util.loops import KeyedLoops, LoopKnob
from aggregator.util.tasks import TaskSet
from aggregator.web.health import NoteBoard

log = logging.getLogger(__name__)

INTERVAL = 30.0
RETRY_INITIAL = 0.5
WORKERS = 5
# The readyz check that passes once the first round of checks has landed.
FIRST_ROUND_CHECK = "apiservice-availability-synced"
# How much longer than one probe timeout readiness waits for the first round at most.
FIRST_ROUND_GRACE = 1.0
# At most one check per APIService this often on the proxy's say-so (`suspect`).
SUSPECT_INTERVAL = 1.0
# Sections of `notes`: the unavailable APIServices, then the ejected endpoints.
UNAVAILABLE_NOTES, EJECTED_NOTES = 0, 1


def _available(conditions: tuple[Condition, ...]) -> bool:
    return any(c.type == "Available" and c.status == "True" for c in conditions)


def _available_condition(conditions: tuple[Condition, ...]) -> Condition | None:
    return next((c for c in conditions if c.type == "Available"), None)


def _spec_changed(old: APIService, new: APIService) -> bool:
    """False for a write that only touched the status (or just bumped the resourceVersion)."""
    return replace(old, conditions=(), resource_version="") != replace(
        new, conditions=(), resource_version=""
    )


class AvailabilityChecker:
    def __init__(
        self,
        store: Store,
        probe: DiscoveryProbe,
        metrics: AvailabilityMetrics,
        sink: StatusSink,
        *,
        interval: float = INTERVAL,
        retry_initial: float = RETRY_INITIAL,
        workers: int = WORKERS,
        access: AccessError | None = None,
        first_round_limit: float | None = None,
        suspect_interval: float = SUSPECT_INTERVAL,
        timer: Callable[[], float] = time.monotonic,
        ejections: EjectionBook | None = None,
        quarantine: DiscoveryQuarantine | None = None,
    ) -> None:
        self.store = store
        # Told every verdict; says in the condition message whether discovery leaves it out.
        self.quarantine = quarantine
        # Extra `/readyz?verbose` lines: backends being down never fails readiness, but is shown.
        self.notes = NoteBoard()
        # The endpoints the proxy holds ejected: named in the condition message, checked again on change.
        self.ejections = ejections
        if ejections is not None:
            ejections.add_listener(self.suspect)
            ejections.add_description_listener(self._note_ejections)
        self.probe = probe
        self.metrics = metrics
        self.sink = sink
        self.access = access
        # A failed check is retried after retry_initial, doubling up to the interval (upstream's
        # rate-limited requeue); a passed one after the interval.
        self.loops: KeyedLoops[str] = KeyedLoops(
            "availability",
            self._check_named,
            interval=interval,
            backoff_initial=retry_initial,
            backoff_max=interval,
            concurrency=workers,
        )
        self._tasks = TaskSet("availability")
        self._verdicts: dict[str, Verdict] = {}
        # APIServices whose backend the last check could not reach, with that check's message.
        self._unreachable: dict[str, str] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._verdict_listeners: list[Callable[[str], None]] = []
        # When each APIService was last re-checked on the proxy's say-so.
        self.suspect_interval = suspect_interval
        self._timer = timer
        self._suspected: dict[str, float] = {}
        self._running = False
        # Checks completed, for tests and for `/readyz?verbose` readers wondering if it runs at all.
        self.checks = 0
        # Readiness: how long to wait for the first round at most (None: the probe timeout + grace),
        # the APIServices still without a first verdict (None until the store synced), and when
        # the wait ends.
        self.first_round_limit = first_round_limit
        self._awaiting: set[str] | None = None
        self._awaiting_sorted: list[str] = []  # the same names in order, for the check's message
        self._first_round_deadline = 0.0
        self._first_round_done = False

    # Knobs (tests shorten them): the loop engine reads them at each scheduling decision.
    @property
    def interval(self) -> float:
        return self.loops.interval

    @interval.setter
    def interval(self, value: float) -> None:
        self.loops.interval = value
        self.loops.backoff_max = value

    retry_initial = LoopKnob("backoff_initial")

    # --- what the rest of the gateway asks ---------------------------------------------------------

    def is_available(self, name: str) -> bool:
        """May requests for this APIService be proxied? (upstream: its Available condition)"""
        verdict = self._verdicts.get(name)
        if verdict is not None:
            return verdict.available
        svc = self.store.apiservice(name)
        return svc is not None and svc.available

    def reason(self, name: str) -> str:
        """The latest verdict's reason, or the object's own condition's before the first check."""
        verdict = self._verdicts.get(name)
        if verdict is not None:
            return verdict.reason
        svc = self.store.apiservice(name)
        condition = _available_condition(svc.conditions) if svc is not None else None
        return condition.reason if condition is not None else ""

    def verdict(self, name: str) -> Verdict | None:
        return self._verdicts.get(name)

    def verdicts(self) -> Iterator[tuple[str, Verdict]]:
        """Every APIService's latest verdict (for a new reader's first copy; then `add_verdict_listener`)."""
        return iter(list(self._verdicts.items()))

    def unreachable(self, name: str) -> str | None:
        """`contracts.Reachability`: the last check's message when it could not reach the backend."""
        return self._unreachable.get(name)

    def awaiting_check(self, name: str) -> bool:
        """`contracts.Reachability`: the first check of this APIService has not recorded a verdict
        yet (before the store synced, every APIService is still to be checked)."""
        if not self._running or name in self._verdicts:
            return False
        return name in self.loops or self._awaiting is None

    def _note_verdict(self, name: str, verdict: Verdict | None) -> None:
        line = None
        if verdict is not None and not verdict.available:
            line = f"warn: APIService {name} is unavailable: {verdict.reason}: {verdict.message}"
        self.notes.set((UNAVAILABLE_NOTES, name), line)

    def _note_ejections(self, name: str, description: str | None) -> None:
        self.notes.set((EJECTED_NOTES, name), f"warn: APIService {name}: {description}" if description else None)

    def first_round_check(self) -> str | None:
        """readyz `apiservice-availability-synced`: None once the first round of checks has landed.

        Passes when every APIService present at start-up has a first verdict (available or not),
        or when the wait passed its limit; from then on it always passes.
        """
        if self._first_round_done:
            return None
        awaiting = self._awaiting
        if awaiting is None:
            return "the APIServices are not listed yet"
        # (Cheap while it fails: every worker's readiness mirrors it, polled every 100 ms.)
        if awaiting and time.monotonic() < self._first_round_deadline:
            names = self._awaiting_sorted
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return f"no availability verdict yet for {', '.join(names[:3])}{more}"
        if awaiting:
            log.warning(
                "ready without a first availability verdict for some APIServices; their checks go on",
                extra=fields(apiservices=",".join(self._awaiting_sorted)),
            )
        self._first_round_done = True
        self._awaiting = set()
        self._awaiting_sorted = []
        return None

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with an APIService name whenever its availability flips (or is first known), and
        whenever its backend becomes reachable or unreachable."""
        self._listeners.append(listener)

    def add_verdict_listener(self, listener: Callable[[str], None]) -> None:
        """Called with an APIService name whenever its verdict changes in any way (its reason or
        message too), or is forgotten; before the status write the verdict causes."""
        self._verdict_listeners.append(listener)

    def poke(self, name: str) -> None:
        """Check this APIService again now."""
        self.loops.poke(name)

    def leadership_changed(self, leading: bool) -> None:
        """A `LeaderElector` listener: a replica that starts leading checks again now every
        APIService whose stored condition does not say what it found while another replica led (and
        it did not write), so the write happens at once, not at the next periodic check up to
        `interval` later. Through the loops, so this and a check never write one APIService at once."""
        if not (leading and self._running):
            return
        for name in self.loops.tracked():
            svc, verdict = self.store.apiservice(name), self._verdicts.get(name)
            if svc is not None and verdict is not None and not verdict.held_by(svc.conditions):
                self.loops.poke(name)

    def suspect(self, name: str) -> None:
        """`contracts.Recheck`: a request just failed to reach this APIService's backend (or was
        refused as unavailable): check it now, or, within a second of the last such check, as soon
        as that second is over (one check per APIService per `suspect_interval` at most, and no
        suspicion lost)."""
        if name not in self.loops:
            return  # not an APIService being checked (the delegate, a deleted one, before sync)
        now = self._timer()
        last = self._suspected.get(name)
        if last is None or now - last >= self.suspect_interval:
            self._suspected[name] = now
            log.debug("APIService suspected by the proxy; checking it now", extra=fields(apiservice=name))
            self.loops.poke(name)
        elif last <= now:
            # The check for this window is already planned at `last` (now or in the past); the next
            # one goes at the window's end.
            self._suspected[name] = last + self.suspect_interval
            self.loops.poke_within(name, last + self.suspect_interval - now)

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        self.loops.start()
        self.store.when_synced(self._tasks, self._first_round, name="first-round")

    def _first_round(self) -> None:
        """Check every APIService the store holds; readiness waits for these first verdicts."""
        names = [svc.name for svc in self.store.apiservices()]
        limit = self.first_round_limit
        if limit is None:
            limit = self.probe.timeout + FIRST_ROUND_GRACE
        self._first_round_deadline = time.monotonic() + limit
        self._awaiting = set(names)
        self._awaiting_sorted = sorted(self._awaiting)
        for name in names:
            self._track(name)

    async def stop(self) -> None:
        self._running = False
        await self._tasks.close()
        await self.loops.stop()

    # --- store events ------------------------------------------------------------------------------

    def on_store_event(self, event: Event) -> None:
        obj = event.obj
        if isinstance(obj, APIService):
            if event.type == DELETED:
                self._forget(obj.name)
            elif not (
                event.type == MODIFIED
                and isinstance(event.old, APIService)
                and not _spec_changed(event.old, obj)
            ):
                self._track(obj.name)
            return
        for svc in self.store.affected_by(event):
            self.poke(svc.name)

    def _track(self, name: str) -> None:
        if not self._running or not self.store.synced:
            return  # the first round picks every APIService up once the store has synced
        if name in self.loops:
            self.loops.poke(name)
        else:
            self.loops.ensure(name)

    def _forget(self, name: str) -> None:
        self.loops.discard(name)
        self._suspected.pop(name, None)
        self._settled(name)
        had = self._verdicts.pop(name, None)
        self.metrics.unavailable.forget(name)
        self.sink.forget(name)
        self.probe.forget(name)
        if self.quarantine is not None:
            self.quarantine.forget(name)
        self._unreachable.pop(name, None)
        if had is not None:
            self._note_verdict(name, None)
            self._verdict_changed(name)
            self._notify(name)

    # --- the loop ----------------------------------------------------------------------------------

    async def _check_named(self, name: str) -> bool:
        return not await self.check_once(name)

    async def check_once(self, name: str) -> bool:
        """Check one APIService and record the verdict; True when it should be retried soon."""
        svc = self.store.apiservice(name)
        if svc is None:
            self._settled(name)
            return False
        # A backend found unreachable last time gets one attempt, not a hedge of five.
        attempts = 1 if name in self._unreachable else None
        try:
            report = await check_apiservice(
                svc, self.store, self.probe, access=self.access, detail=False, attempts=attempts
            )
        except Exception:
            log.exception("availability check failed unexpectedly", extra=fields(apiservice=name))
            self._settled(name)  # a broken check must not hold readiness
            return True
        self.checks += 1
        extra = list(read_bounds(svc.annotations).problems)  # named where operators look
        ejected = self.ejections.describe(name) if self.ejections is not None else None
        if ejected is not None:
            extra.append(ejected)
        quarantine = self.quarantine
        quarantined = quarantine.describe(name, report.verdict.available) if quarantine is not None else None
        if quarantined is not None:
            extra.append(quarantined)
        if extra:
            report.verdict = replace(report.verdict, message="; ".join((report.verdict.message, *extra)))
        current = self.store.apiservice(name)
        if current is not None and current is not svc and _spec_changed(svc, current):
            # The APIService changed while it was being checked (a new caBundle, another Service):
            # this verdict is about what it was. The change already asked for a check of what it is.
            log.debug("verdict about a changed APIService dropped", extra=fields(apiservice=name))
            return False
        try:
            await self.record(report)
        finally:
            self._settled(name)
        return report.verdict.reason in cond.DISCOVERY_CHECK_REASONS

    def _settled(self, name: str) -> None:
        """`name` has had its first check (or is gone): readiness no longer waits for it."""
        if self._awaiting and name in self._awaiting:
            self._awaiting.discard(name)
            names = self._awaiting_sorted
            index = bisect.bisect_left(names, name)
            if index < len(names) and names[index] == name:
                del names[index]

    async def record(self, report: Report) -> None:
        """Make `report.verdict` the APIService's availability: view, gauge, sink, counter."""
        name, verdict = report.name, report.verdict
        svc = self.store.apiservice(name)
        if svc is None:
            return  # deleted while it was being checked
        was = self.is_available(name)
        previous = self._verdicts.get(name)
        self._verdicts[name] = verdict
        self._settled(name)
        if self.quarantine is not None:
            self.quarantine.observe(name, verdict.available)
        self.metrics.unavailable.set(name, not verdict.available)
        unreachable = report.unreachable and not verdict.available
        reach_changed = unreachable != (name in self._unreachable)
        if unreachable:
            self._unreachable[name] = verdict.message
        else:
            self._unreachable.pop(name, None)
        if verdict != previous:
            self._note_verdict(name, verdict)
            self._verdict_changed(name)
        if previous is None or was != verdict.available or reach_changed:
            self._notify(name)
        if verdict != previous:  # a repeated verdict (a dead backend, every retry) logs nothing
            log.debug(
                "APIService checked",
                extra=fields(
                    apiservice=name, status=verdict.status, reason=verdict.reason, message=verdict.message
                ),
            )
        try:
            change = await self.sink.apply(svc, verdict)
        except Exception as err:
            log.warning(
                "APIService status not recorded; trying again on the next check",
                extra=fields(apiservice=name, reason=str(err) or type(err).__name__),
            )
            return
        if change is not None:
            self._recorded(name, change)

    def _recorded(self, name: str, change: Change) -> None:
        before, after = _available_condition(change.before), _available_condition(change.after)
        was, now = _available(change.before), _available(change.after)
        if was != now and not now:
            reason = after.reason if after is not None and after.reason else cond.UNKNOWN_REASON
            self.metrics.unavailable_total.labels(name, reason).inc()
        if was != now or before is None:
            log.info(
                "APIService availability changed",
                extra=fields(
                    apiservice=name,
                    old_status=before.status if before else "Unknown",
                    new_status=after.status if after else "Unknown",
                    reason=after.reason if after else "",
                    message=after.message if after else "",
                ),
            )
        elif after is not None and before.reason != after.reason:
            # Still unavailable, but for another reason (EndpointsNotFound, then FailedDiscoveryCheck
            # once the pods are up): the next thing to fix moved. Upstream logs any condition change
            # (`updateAPIServiceStatus`: "changing APIService availability").
            log.info(
                "APIService availability reason changed",
                extra=fields(
                    apiservice=name,
                    status=after.status,
                    old_reason=before.reason,
                    reason=after.reason,
                    message=after.message,
                ),
            )

    def _notify(self, name: str, listeners: list[Callable[[str], None]] | None = None) -> None:
        for listener in self._listeners if listeners is None else listeners:
            try:
                listener(name)
            except Exception:
                log.exception("availability listener failed", extra=fields(apiservice=name))

    def _verdict_changed(self, name: str) -> None:
        self._notify(name, self._verdict_listeners)
