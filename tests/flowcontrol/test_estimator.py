"""Seats per request (request/*_work_estimator.go) with what the gateway knows: no object counts."""

from __future__ import annotations

from aggregator.flowcontrol.estimator import WatchTracker, WorkEstimator
from aggregator.flowcontrol.queueset import WorkEstimate
from aggregator.web.requestinfo import new_request_info
from aggregator.wire.gourl import parse_query


def estimate(method: str, path: str, query: str = "", *, watches: WatchTracker | None = None, max_seats: int = 0) -> WorkEstimate:
    q = parse_query(query)
    estimator = WorkEstimator(watches or WatchTracker(), lambda _level: max_seats)
    work, _count = estimator.estimate(new_request_info(method, path, q), q, "level")
    return work


def test_a_list_of_a_resource_whose_count_is_unknown_takes_one_seat_as_upstream() -> None:
    assert estimate("GET", "/apis/x.io/v1/things", "limit=500") == WorkEstimate(1)
    assert estimate("GET", "/apis/x.io/v1/things", "watch=true&sendInitialEvents=true") == WorkEstimate(1)
    assert estimate("GET", "/apis/x.io/v1/things/a") == WorkEstimate(1)


def test_a_list_whose_options_do_not_parse_takes_the_maximum() -> None:
    assert estimate("GET", "/apis/x.io/v1/things", "limit=ten") == WorkEstimate(10)
    assert estimate("GET", "/apis/x.io/v1/things", "limit=%2010") == WorkEstimate(10)  # Go's ParseInt: no spaces
    assert estimate("GET", "/apis/x.io/v1/things", "limit=ten", max_seats=4) == WorkEstimate(4)


def test_a_write_takes_final_seats_for_the_watches_it_will_notify() -> None:
    watches = WatchTracker()
    forget = [
        watches.register(new_request_info("GET", "/apis/x.io/v1/namespaces/a/things", parse_query("watch=1")), lambda _f: None)
        for _ in range(25)
    ]
    write = estimate("PUT", "/apis/x.io/v1/namespaces/a/things/t", watches=watches)
    assert write == WorkEstimate(1, 3, 0.005)  # ceil(25/10) seats for 3 x 5 ms of work
    assert estimate("PUT", "/apis/x.io/v1/namespaces/b/things/t", watches=watches) == WorkEstimate(1)
    assert estimate("PUT", "/apis/x.io/v1/namespaces/a/things/t", watches=watches, max_seats=2) == WorkEstimate(1, 2, 0.0075)
    for f in forget:
        assert f is not None
        f()
    assert estimate("PUT", "/apis/x.io/v1/namespaces/a/things/t", watches=watches) == WorkEstimate(1)


def test_a_watch_of_one_nodes_pods_is_not_counted() -> None:
    watches = WatchTracker()
    pods = new_request_info("GET", "/api/v1/pods", parse_query("watch=1&fieldSelector=spec.nodeName%3Dn1"))
    watches.register(pods, lambda field: "n1" if field == "spec.nodeName" else None)
    assert watches.counts == {}
