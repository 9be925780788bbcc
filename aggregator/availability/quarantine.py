"""Discovery quarantine: an APIService unavailable for longer than it allows leaves discovery.

kube-aggregator keeps every APIService's group-version in `/apis` whatever its availability, so
one dead metrics-server makes every discovery client fail (`kubectl api-resources` exits 1 with
"unable to retrieve the complete list of server APIs", Helm and controllers stop on it:
kubernetes#60807, #83332). For groups that store no objects that is all cost and no use, and users
delete the APIService by hand. With the annotation `aggregator.dev/discovery-quarantine-after`
(read with the other annotations, `backends/bounds.py`), an APIService whose verdict has been
unavailable for that long is *quarantined*: its group-version leaves the legacy and aggregated
`/apis`, `/apis/<group>` and OpenAPI (v2 and the v3 index), and comes back the moment a verdict
says Available. Requests to it still get the proxy's 503.

The time counts from this gateway's first unavailable verdict (a restart counts again: the
stored condition may be another writer's). The book is fed by the availability checker
(`observe`, every verdict) and the store (the annotation); listeners (discovery, OpenAPI, the
checker's re-check, so the condition message says so) hear of every entry and exit; the gauge
`aggregator_apiservice_discovery_quarantined{apiservice}` is 1 while quarantined, 0 while
merely watched (annotated), and absent without the annotation. Off by default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from aggregator.backends.bounds import DISCOVERY_QUARANTINE_AFTER, read_bounds
from aggregator.model.apiservice import APIService, now_rfc3339
from aggregator.sources.store import DELETED, Event, Kind, Store
from aggregator.util.logs import fields
from aggregator.web.metrics import Families

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# Runs the callback after this many seconds (the event loop's `call_later`; tests pass a fake).
Schedule = Callable[[float, Callable[[], None]], Cancellable]


def _call_later(delay: float, callback: Callable[[], None]) -> Cancellable:
    return asyncio.get_running_loop().call_later(delay, callback)


class QuarantineMetrics:
    """`aggregator_apiservice_discovery_quarantined{apiservice}`: declared by the feature that sets it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.quarantined = Families(registry).gauge(
            "aggregator_apiservice_discovery_quarantined",
            "1 while an APIService is left out of discovery and OpenAPI after being unavailable for "
            "longer than its aggregator.dev/discovery-quarantine-after, 0 while it is not (only "
            "APIServices with that annotation have a series).",
            ["apiservice"],
        )


@dataclass
class _Watch:
    """One annotated APIService: its limit, since when it is unavailable, and the timer to enter."""

    after: float
    text: str  # the annotation's value, as written (named in messages)
    since: float | None = None  # clock() of the first unavailable verdict of this outage
    entered: str = ""  # RFC 3339 time it was quarantined; "" while it is not
    timer: Cancellable | None = field(default=None, repr=False)


@dataclass(eq=False)
class DiscoveryQuarantine:
    """Which APIServices are quarantined (`contracts.Quarantined`), kept by verdicts and annotations."""

    store: Store
    metrics: QuarantineMetrics
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    schedule: Schedule = _call_later
    _watches: dict[str, _Watch] = field(default_factory=dict, init=False)
    _listeners: list[Callable[[str], None]] = field(default_factory=list, init=False)
    quarantined: frozenset[str] = field(default=frozenset(), init=False)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with the APIService's name when it enters or leaves quarantine."""
        self._listeners.append(listener)

    # --- inputs ------------------------------------------------------------------------------------

    def observe(self, name: str, available: bool) -> None:
        """The availability checker's verdict on `name` (every one, repeated ones included)."""
        watch = self._watch(name)
        if watch is None:
            return
        if available:
            watch.since = None
            self._cancel(watch)
            if watch.entered:
                self._leave(name, watch, "the APIService is Available again")
            return
        if watch.since is None:
            watch.since = self.clock()
        if not watch.entered and watch.timer is None:
            self._arm(name, watch)

    def on_store_event(self, event: Event) -> None:
        """A new or changed annotation takes effect at once (a removed one ends the quarantine)."""
        if event.kind is not Kind.APISERVICE or event.status_only:
            return
        obj = event.obj
        assert isinstance(obj, APIService)
        if event.type == DELETED:
            self.forget(obj.name)
            return
        watch = self._watch(obj.name)
        if watch is not None and watch.since is not None and not watch.entered:
            self._cancel(watch)
            self._arm(obj.name, watch)  # a new limit counts from the same start

    def forget(self, name: str) -> None:
        """The APIService is gone (or no longer checked)."""
        watch = self._watches.pop(name, None)
        if watch is None:
            return
        self._cancel(watch)
        self.metrics.quarantined.remove(name)
        if watch.entered:
            self._leave(name, watch, "the APIService was deleted", forget=True)

    async def start(self) -> None:
        """Nothing to start: verdicts and store events drive it."""

    async def stop(self) -> None:
        for watch in self._watches.values():
            self._cancel(watch)

    # --- what the condition says -------------------------------------------------------------------

    def describe(self, name: str, available: bool) -> str | None:
        """A line for the Available condition's message, for a verdict being recorded (None: none)."""
        if available:
            return None
        watch = self._watch(name)
        if watch is None:
            return None
        annotation = f"{DISCOVERY_QUARANTINE_AFTER}={watch.text}"
        if watch.entered:
            return f"quarantined: left out of discovery and OpenAPI since {watch.entered} ({annotation})"
        return f"leaves discovery and OpenAPI after {watch.text} unavailable ({annotation})"

    # --- state -------------------------------------------------------------------------------------

    def _watch(self, name: str) -> _Watch | None:
        """The APIService's watch, as its annotation now says (None: not annotated, or local)."""
        svc = self.store.apiservice(name)
        after = read_bounds(svc.annotations).discovery_quarantine_after if svc and not svc.local else None
        watch = self._watches.get(name)
        if after is None or svc is None:
            if watch is not None:
                self._cancel(watch)
                self.metrics.quarantined.remove(name)
                del self._watches[name]
                if watch.entered:
                    self._leave(name, watch, "its annotation was removed", forget=True)
            return None
        text = dict(svc.annotations)[DISCOVERY_QUARANTINE_AFTER]
        if watch is None:
            watch = self._watches[name] = _Watch(after, text)
            self.metrics.quarantined.labels(name).set(0)
        elif watch.after != after:
            watch.after, watch.text = after, text
        return watch

    def _arm(self, name: str, watch: _Watch) -> None:
        assert watch.since is not None
        left = watch.since + watch.after - self.clock()
        if left <= 0:
            self._enter(name)
        else:
            watch.timer = self.schedule(left, lambda: self._enter(name))

    @staticmethod
    def _cancel(watch: _Watch) -> None:
        if watch.timer is not None:
            watch.timer.cancel()
            watch.timer = None

    def _enter(self, name: str) -> None:
        watch = self._watches.get(name)
        if watch is None or watch.since is None or watch.entered:
            return
        watch.timer = None
        watch.entered = now_rfc3339()
        self.quarantined = self.quarantined | {name}
        self.metrics.quarantined.labels(name).set(1)
        log.warning(
            "APIService quarantined: its group-version leaves discovery and OpenAPI until it is Available",
            extra=fields(
                apiservice=name,
                unavailable_seconds=round(self.clock() - watch.since, 3),
                annotation=f"{DISCOVERY_QUARANTINE_AFTER}={watch.text}",
            ),
        )
        self._notify(name)

    def _leave(self, name: str, watch: _Watch, why: str, *, forget: bool = False) -> None:
        since = watch.entered
        watch.entered = ""
        self.quarantined = self.quarantined - {name}
        if not forget:
            self.metrics.quarantined.labels(name).set(0)
        log.info(
            "APIService out of quarantine: its group-version is back in discovery and OpenAPI",
            extra=fields(apiservice=name, reason=why, quarantined_since=since),
        )
        self._notify(name)

    def _notify(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:
                log.exception("quarantine listener failed", extra=fields(apiservice=name))
