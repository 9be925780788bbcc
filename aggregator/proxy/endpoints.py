"""Where each proxied request of one APIService goes, and which endpoints are left out for a while.

Upstream's `ResolveEndpoint` picks a random ready endpoint per request and never tries another; a
dead replica then fails its share of requests until its EndpointSlice says it is not ready. Here,
one `Endpoints` per APIService (kept across changes of its objects by `HandlingTable`):

- balancing: power of two choices (two endpoints at random, the cheaper one unless their costs are
  within `NOISE` of each other), where an endpoint's
  cost is its requests in flight plus one, times its recent time to first byte (a moving average;
  an endpoint not chosen for `STALE` seconds, or that lost `LOSSES` pairs in a row, gets one
  request as if it were new, so a replica that was slow is tried again): close to Finagle's "peak EWMA". Long-running requests are not counted (a watch
  is not load). A replica 200 ms slower than its peers then gets a few percent of the requests.
- passive outlier ejection: an endpoint that refuses or resets a connection, fails TLS or does not
  connect in time is ejected at once; `consecutive_errors` 502/503/504 answers in a row eject it
  too. The cooldown starts at `ejection_time` and doubles each time it is ejected again without a
  good answer in between, up to `max_ejection_time`. Never more than half of the endpoints are
  ejected (the rest keep their share rather than overload the healthy ones on a hunch). After
  its cooldown an endpoint gets one probe (the discovery GET availability makes) and is back only
  when it answers; until then it stays ejected.

The state is per process: with `--workers N` every worker ejects on what its own requests see (a
dead replica costs each worker one retried request, never a failed one) and probes on its own.
"""

from __future__ import annotations

import random
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence

from aggregator.backends.bounds import DEFAULT_BOUNDS, Bounds
from aggregator.proxy.destination import Destination
from aggregator.web.metrics import LATENCY_BUCKETS

# Time-to-first-byte buckets of `aggregator_endpoint_first_byte_duration_seconds` (endpointmetrics.py),
# counted on each endpoint.
FIRST_BYTE_BUCKETS = LATENCY_BUCKETS
# The counts of an endpoint that has had no answer yet: one shared tuple instead of a list each (a
# worker holds an endpoint per Service address, most of them idle).
NO_ANSWERS: tuple[int, ...] = (0,) * (len(FIRST_BYTE_BUCKETS) + 1)
# The answers that count towards `consecutive_errors`.
BAD_ANSWERS = frozenset({502, 503, 504})
# The weight of the newest time to first byte in an endpoint's moving average.
ALPHA = 0.3
# Added to every latency: differences of a few milliseconds are noise, requests in flight are not.
LATENCY_FLOOR = 0.005
# An endpoint not chosen for this long is tried once as if its average were unknown (a replica
# that was slow gets one request per period to show it is fast again).
STALE = 2.0
# Costs closer than this factor are the same cost: latencies of equal replicas differ by noise, and
# the one that happened to be a little slower would otherwise lose every pair it is in (a third of
# three equal replicas starved on a loaded machine). One request in flight more doubles a cost.
NOISE = 1.5
# An endpoint that lost this many pairs in a row is tried once as if its average were unknown, as
# after `STALE`: under a burst, a replica priced out by one slow answer (a loaded machine's hiccup)
# would otherwise get nothing for a whole period (4 of 600 GETs went to one of three equal replicas).
# A replica that is really slow then gets about one request in `LOSSES` pairs it is drawn into.
LOSSES = 32


class Endpoint:
    """One address of the Service as the proxy sees it."""

    __slots__ = (
        "attempts",
        "authority",
        "bad_answers",
        "destination",
        "ejected_until",
        "ejections",
        "first_byte_counts",
        "first_byte_sum",
        "latency",
        "losses",
        "outstanding",
        "probing",
        "reason",
        "timed",
        "trial",
    )

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.authority = destination.authority
        self.outstanding = 0
        # `aggregator_endpoint_requests_total` and the time-to-first-byte histogram (endpointmetrics.py).
        self.attempts = 0
        # A list once it has an answer to count (an endpoint never used holds the shared zeros).
        self.first_byte_counts: list[int] | tuple[int, ...] = NO_ANSWERS
        self.first_byte_sum = 0.0
        self.latency = 0.0  # moving average of the time to first byte (seconds; 0: none yet)
        self.timed = 0.0  # when it was last updated (the clock of `Endpoints`)
        self.trial = False  # chosen because its average was stale: its next answer replaces it
        self.losses = 0  # pairs lost since it was last chosen
        self.bad_answers = 0  # consecutive 502/503/504
        self.ejected_until: float | None = None  # set while ejected (past it: waiting for a probe)
        self.ejections = 0  # ejections since the last good answer (the cooldown's doubling)
        self.reason = ""
        self.probing = False


# Told of an ejection (name, endpoint, why) and of a return (reason ""): metrics and logs.
Listener = Callable[[str, Endpoint, str], None]
# Starts the probe of an ejected endpoint; the probe calls `Endpoints.probed` when it is done.
Prober = Callable[["Endpoints", Endpoint], None]


class Endpoints:
    """The endpoints of one APIService: balancing and ejection (see the module docstring)."""

    __slots__ = (
        "all",
        "bounds",
        "clock",
        "ejected_count",
        "listener",
        "name",
        "prober",
        "rng",
    )

    def __init__(
        self,
        name: str,
        *,
        rng: random.Random,
        prober: Prober | None = None,
        listener: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.rng = rng
        self.prober = prober
        self.listener = listener
        self.clock = clock
        self.bounds = DEFAULT_BOUNDS
        self.all: tuple[Endpoint, ...] = ()
        self.ejected_count = 0

    def update(self, destinations: Sequence[Destination], bounds: Bounds) -> list[Endpoint]:
        """The Service's endpoints changed: keep the state of those still there; returns the gone."""
        self.bounds = bounds
        # By address only here, while they change: a dict kept per APIService cost every worker
        # a few hundred bytes an APIService, for a lookup made only when its endpoints change.
        by_authority = {endpoint.authority: endpoint for endpoint in self.all}
        kept: dict[str, Endpoint] = {}
        for dest in destinations:
            endpoint = by_authority.get(dest.authority)
            if endpoint is None or endpoint.destination != dest:
                previous = endpoint
                endpoint = Endpoint(dest)
                if previous is not None:  # same address, new settings: its record goes on
                    endpoint.ejected_until, endpoint.ejections = previous.ejected_until, previous.ejections
                    endpoint.reason, endpoint.bad_answers = previous.reason, previous.bad_answers
                    endpoint.attempts, endpoint.first_byte_counts = (
                        previous.attempts,
                        previous.first_byte_counts,
                    )
                    endpoint.first_byte_sum = previous.first_byte_sum
                    endpoint.latency, endpoint.timed = previous.latency, previous.timed
            kept[dest.authority] = endpoint
        gone = [e for a, e in by_authority.items() if a not in kept]
        self.all = tuple(kept.values())
        self.ejected_count = sum(1 for e in self.all if e.ejected_until is not None)
        return gone

    # --- choosing ------------------------------------------------------------------------------------

    def choose(self, avoid: Endpoint | None = None) -> Endpoint:
        """The endpoint for the next attempt, never `avoid` when there is another one."""
        candidates = self.all
        if self.ejected_count:
            now = self.clock()
            healthy = []
            for endpoint in candidates:
                until = endpoint.ejected_until
                if until is None:
                    healthy.append(endpoint)
                elif until <= now and not endpoint.probing and self.prober is not None:
                    endpoint.probing = True
                    self.prober(self, endpoint)
            if healthy:
                candidates = tuple(healthy)
        if avoid is not None and len(candidates) > 1:
            candidates = tuple(e for e in candidates if e is not avoid)
        count = len(candidates)
        if count == 1:
            return candidates[0]
        # Two distinct endpoints at random (`random()` is a tenth of `sample`'s cost).
        draw = self.rng.random
        i = int(draw() * count)
        j = int(draw() * (count - 1))
        first, second = candidates[i], candidates[j + 1 if j >= i else j]
        now = self.clock()
        stale = now - STALE
        first_cost = (first.outstanding + 1) * (
            LATENCY_FLOOR + (first.latency if first.timed > stale and first.losses < LOSSES else 0.0)
        )
        second_cost = (second.outstanding + 1) * (
            LATENCY_FLOOR + (second.latency if second.timed > stale and second.losses < LOSSES else 0.0)
        )
        # `first` is already a random one of the two: it stays unless `second` is clearly cheaper.
        if second_cost * NOISE < first_cost:
            chosen = second
            first.losses += 1
        else:
            chosen = first
            second.losses += 1
        if chosen.timed <= stale or chosen.losses >= LOSSES:
            chosen.timed = now  # one trial per period: its answer replaces the average
            chosen.trial = True
        chosen.losses = 0
        return chosen

    # --- what happened -------------------------------------------------------------------------------

    def answered(self, endpoint: Endpoint, status: int, took: float) -> bool:
        """The endpoint answered (its response head arrived `took` seconds after the request went);
        True when that answer ejected it."""
        latency = endpoint.latency
        if latency == 0.0 or endpoint.trial:
            # A trial's answer starts the average afresh: one slow answer seconds ago (a loaded
            # machine's hiccup) must not keep a healthy replica out for trial after trial.
            endpoint.latency = took
            endpoint.trial = False
        else:
            endpoint.latency = latency + (took - latency) * ALPHA
        endpoint.timed = self.clock()
        counts = endpoint.first_byte_counts
        if not isinstance(counts, list):
            counts = endpoint.first_byte_counts = list(counts)
        counts[bisect_left(FIRST_BYTE_BUCKETS, took)] += 1
        endpoint.first_byte_sum += took
        if status in BAD_ANSWERS:
            endpoint.bad_answers += 1
            limit = self.bounds.consecutive_errors
            if limit and endpoint.bad_answers >= limit:
                return self.eject(endpoint, f"{endpoint.bad_answers} consecutive {status} answers")
            return False
        endpoint.bad_answers = 0
        endpoint.ejections = 0
        return False

    def unreachable(self, endpoint: Endpoint, cause: str) -> bool:
        """The endpoint refused or reset a connection, failed TLS, or did not connect in time;
        True when it was ejected for it (not already, and not past half of the endpoints)."""
        return self.eject(endpoint, cause)

    def eject(self, endpoint: Endpoint, reason: str) -> bool:
        """Leave the endpoint out for its cooldown; False when it is ejected already or when half of
        the endpoints are."""
        if endpoint.ejected_until is not None:
            return False
        if (self.ejected_count + 1) * 2 > len(self.all):
            return False
        self._cool_down(endpoint, reason)
        endpoint.bad_answers = 0
        self.ejected_count += 1
        if self.listener is not None:
            self.listener(self.name, endpoint, reason)
        return True

    def _cool_down(self, endpoint: Endpoint, reason: str) -> None:
        """Eject for `ejection_time`, doubled for each ejection since the last good answer, capped."""
        bounds = self.bounds
        cooldown = min(bounds.ejection_time * (1 << min(endpoint.ejections, 30)), bounds.max_ejection_time)
        endpoint.ejected_until = self.clock() + cooldown
        endpoint.ejections += 1
        endpoint.reason = reason

    def probed(self, endpoint: Endpoint, failure: str | None) -> None:
        """The probe of an ejected endpoint ended: back when it answered, else a longer cooldown."""
        endpoint.probing = False
        if endpoint.ejected_until is None or endpoint not in self.all:
            return
        if failure is not None:
            self._cool_down(endpoint, failure)
            return
        endpoint.ejected_until = None
        endpoint.reason = ""
        self.ejected_count -= 1
        if self.listener is not None:
            self.listener(self.name, endpoint, "")

    def ejected(self) -> list[tuple[str, str, float]]:
        """(endpoint, why, seconds of cooldown left) for every ejected endpoint."""
        now = self.clock()
        return [
            (e.authority, e.reason, max(0.0, e.ejected_until - now))
            for e in self.all
            if e.ejected_until is not None
        ]
