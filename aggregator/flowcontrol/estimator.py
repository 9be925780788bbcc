"""How many seats a request takes: `k8s.io/apiserver/pkg/util/flowcontrol/request/` (width.go,
list_work_estimator.go, mutating_work_estimator.go, config.go) and the watch tracker
(`watch_tracker.go`), with kube-apiserver 1.32's defaults (minimum 1 seat, at most 10 or the
level's own maximum, 100 objects per seat, 10 watches per seat, 5 ms per event; `WatchList` on).

A LIST's seats come from the number of objects stored for its resource, which kube-apiserver knows
for what it stores itself and not for what it proxies: its object count tracker has no entry for
an aggregated resource (`ObjectCountNotFoundErr`), and then the estimate is the minimum, one seat.
The gateway stores nothing, so every LIST it serves gets the answer kube-apiserver gives an
aggregated one; a LIST whose options do not parse gets the maximum, as upstream. A mutating request
costs one seat, plus final seats for the watches it will have to notify (those the gateway is
carrying for the same resource, namespace or name, as kube-apiserver counts the watches it carries),
held for the time their events take.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from aggregator.flowcontrol.queueset import ONE_SEAT, WorkEstimate
from aggregator.web.requestinfo import RequestInfo

MINIMUM_SEATS = 1
MAXIMUM_SEATS_LIMIT = 10
OBJECTS_PER_SEAT = 100.0
WATCHES_PER_SEAT = 10.0
EVENT_ADDITIONAL_DURATION = 0.005
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete"})
READ_ONLY_VERBS = frozenset({"get", "list", "watch", "proxy"})
# `pods` is indexed by spec.nodeName: a watch of one node's pods is not counted for every pod change.
BUILTIN_INDEXES = {"pods": "spec.nodeName"}
_INT_OPTIONS = ("limit", "timeoutSeconds")
_GO_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)

WatchKey = tuple[str, str, str, str]  # (apiGroup, resource, namespace, name)


def _parses(query: Mapping[str, list[str]]) -> bool:
    """Whether `Convert_url_Values_To_v1_ListOptions` accepts the query: its integer fields must
    parse as Go's `strconv.ParseInt(v, 10, 64)` (its booleans accept anything)."""
    for key in _INT_OPTIONS:
        values = query.get(key)
        if values and (not _GO_INT.fullmatch(values[0]) or not -(2**63) <= int(values[0]) < 2**63):
            return False
    return True


class WatchTracker:
    """`watchTracker`: the watches executing through this process, by what they watch."""

    def __init__(self) -> None:
        self.counts: dict[WatchKey, int] = {}

    def register(self, info: RequestInfo, field_value: Callable[[str], str | None]) -> Callable[[], None] | None:
        """`RegisterWatch`: count a watch; returns how to forget it. `field_value(field)` is the value
        an exact field selector pins, if any (for the built-in indexes)."""
        if info.verb != "watch":
            return None
        key = (info.api_group, info.resource, info.namespace, info.name)
        index = BUILTIN_INDEXES.get(info.resource)
        if index is not None and field_value(index):
            return lambda: None  # an indexed watch is not counted (upstream's updateIndexLocked)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1

        def forget() -> None:
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)

        return forget

    def interested(self, info: RequestInfo) -> int:
        """`GetInterestedWatchCount`: watches of the resource, its namespace and the object."""
        if info.verb in READ_ONLY_VERBS or not self.counts:
            return 0
        counts = self.counts
        result = counts.get((info.api_group, info.resource, "", ""), 0)
        if info.namespace:
            result += counts.get((info.api_group, info.resource, info.namespace, ""), 0)
        if info.name:
            result += counts.get((info.api_group, info.resource, info.namespace, info.name), 0)
        return result


class WorkEstimator:
    """`NewWorkEstimator` with the default configuration: the seats of one request."""

    def __init__(self, watches: WatchTracker, max_seats: Callable[[str], int]) -> None:
        self.watches = watches
        self.max_seats = max_seats  # the level's maximum (MaxSeatsTracker); 0: none set

    def _maximum(self, level: str) -> int:
        seats = self.max_seats(level)
        return MAXIMUM_SEATS_LIMIT if seats == 0 or seats > MAXIMUM_SEATS_LIMIT else seats

    def estimate(
        self, info: RequestInfo, query: Mapping[str, list[str]], level: str
    ) -> tuple[WorkEstimate, int | None]:
        """The estimate, and the watch count a mutating request saw (for `watch_count_samples`)."""
        verb = info.verb
        if verb == "list" or verb == "watch":
            return self._list(info, query, level), None
        if verb in MUTATING_VERBS:
            return self._mutating(info, level)
        return ONE_SEAT, None

    def _list(self, info: RequestInfo, query: Mapping[str, list[str]], level: str) -> WorkEstimate:
        """`listWorkEstimator.estimate` when the object count is unknown (`ObjectCountNotFoundErr`)."""
        if info.name:
            return ONE_SEAT
        if query and not _parses(query):
            return WorkEstimate(self._maximum(level))
        return ONE_SEAT

    def _mutating(self, info: RequestInfo, level: str) -> tuple[WorkEstimate, int | None]:
        if info.resource == "serviceaccounts" and info.subresource == "token":
            return ONE_SEAT, None
        count = self.watches.interested(info)
        if count < WATCHES_PER_SEAT:
            return ONE_SEAT, count
        final_seats = math.ceil(count / WATCHES_PER_SEAT)
        final_work = final_seats * EVENT_ADDITIONAL_DURATION
        final_seats = min(final_seats, self._maximum(level))
        return WorkEstimate(1, final_seats, final_work / final_seats), count
