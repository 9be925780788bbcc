"""Balancing and passive outlier ejection over one APIService's endpoints, on a fake clock."""

from __future__ import annotations

import random
from collections import Counter

from aggregator.backends.backend import Backend
from aggregator.backends.bounds import read_bounds
from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.proxy.destination import Destination
from aggregator.proxy.endpoints import LOSSES, Endpoint, Endpoints

BACKEND = Backend("test", context=None)


IDENTITY = LiveIdentityPolicy()


def dest(host: str) -> Destination:
    return Destination("v1.demo.example.com", BACKEND, host, 443, "api.demo.svc", IDENTITY)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def endpoints(
    *hosts: str, annotations: tuple[tuple[str, str], ...] = ()
) -> tuple[Endpoints, Clock, list[Endpoint]]:
    clock = Clock()
    probes: list[Endpoint] = []
    set_ = Endpoints(
        "v1.demo.example.com", rng=random.Random(3), clock=clock, prober=lambda _s, e: probes.append(e)
    )
    set_.update([dest(h) for h in hosts], read_bounds(annotations))
    return set_, clock, probes


def by_host(set_: Endpoints) -> dict[str, Endpoint]:
    return {e.destination.host: e for e in set_.all}


def test_the_endpoint_with_fewer_requests_in_flight_wins() -> None:
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3")
    hosts = by_host(set_)
    hosts["10.0.0.1"].outstanding = 5  # slow: its requests pile up
    picked = Counter(set_.choose().destination.host for _ in range(600))
    assert picked["10.0.0.1"] == 0  # it loses every pair it is in
    assert picked["10.0.0.2"] > 200 and picked["10.0.0.3"] > 200


def test_endpoints_whose_costs_differ_by_noise_share_the_requests() -> None:
    """Equal replicas on a loaded machine answer in 4, 5 and 6 ms: the one a millisecond slower
    must not lose every pair it is in (it was starved for a whole run of 600 GETs)."""
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3")
    for endpoint, took in zip(set_.all, (0.004, 0.005, 0.006), strict=True):
        set_.answered(endpoint, 200, took)
    picked = Counter(set_.choose().destination.host for _ in range(600))
    assert all(picked[host] > 120 for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3")), picked


def test_a_slow_endpoint_loses_to_a_fast_one_and_is_tried_once_a_period() -> None:
    set_, clock, _ = endpoints("10.0.0.1", "10.0.0.2")
    slow, fast = by_host(set_)["10.0.0.1"], by_host(set_)["10.0.0.2"]
    set_.answered(slow, 200, 0.205)
    set_.answered(fast, 200, 0.005)
    fast.outstanding = 3  # busier, but 40 times faster: still the cheaper one
    assert all(set_.choose() is fast for _ in range(LOSSES - 1))
    fast.outstanding = 50  # so busy that the slow one is cheaper
    assert set_.choose() is slow
    fast.outstanding = 3
    clock.now += 2.0  # the slow one was not chosen for a while: one trial, then the fast one again
    fast.timed = clock.now
    picked = [set_.choose() for _ in range(20)]
    assert picked.count(slow) == 1
    set_.answered(slow, 200, 0.005)  # it is fast now: its average comes down
    assert slow.latency < 0.205


def test_a_slow_endpoint_gets_one_request_in_so_many_pairs_it_loses() -> None:
    """Under a burst the period never passes: the slow endpoint is tried once per `LOSSES` pairs
    lost, and while it stays slow it keeps that small share."""
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2")
    slow, fast = by_host(set_)["10.0.0.1"], by_host(set_)["10.0.0.2"]
    set_.answered(fast, 200, 0.005)
    set_.answered(slow, 200, 0.205)
    picked = []
    for _ in range(10 * LOSSES):
        chosen = set_.choose()
        picked.append(chosen)
        set_.answered(chosen, 200, 0.205 if chosen is slow else 0.005)
    assert [i for i, e in enumerate(picked) if e is slow] == list(range(LOSSES, 10 * LOSSES, LOSSES + 1))


def test_one_slow_answer_costs_a_healthy_endpoint_a_few_requests_not_a_period() -> None:
    """A loaded machine's hiccup (one 80 ms answer among 2 ms ones) in a burst of 600 GETs that
    takes less than a period: the endpoint loses pairs until it has lost `LOSSES` in a row, and
    its trial's fast answer puts it back at once (one of three equal replicas got 4 of 600)."""
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3")
    hosts = by_host(set_)
    for endpoint in hosts.values():
        set_.answered(endpoint, 200, 0.002)
    hiccup = hosts["10.0.0.2"]
    set_.answered(hiccup, 200, 0.080)
    picked = []
    for _ in range(600):
        chosen = set_.choose()
        picked.append(chosen)
        set_.answered(chosen, 200, 0.002)
    first = picked.index(hiccup)
    assert LOSSES <= first <= 3 * LOSSES, first
    assert Counter(picked[first:])[hiccup] > (600 - first) / 4


def test_a_retry_avoids_the_endpoint_that_failed() -> None:
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2")
    first = by_host(set_)["10.0.0.1"]
    assert all(set_.choose(avoid=first) is not first for _ in range(50))
    single, _, _ = endpoints("10.0.0.9")
    only = single.all[0]
    assert single.choose(avoid=only) is only  # nowhere else to go: the same address, a new connection


def test_an_unreachable_endpoint_is_ejected_at_once_and_back_only_after_a_probe() -> None:
    set_, clock, probes = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3")
    dead = by_host(set_)["10.0.0.1"]
    assert set_.eject(dead, "dial tcp 10.0.0.1:443: connect: connection refused")
    assert all(set_.choose() is not dead for _ in range(100))
    assert set_.ejected() == [("10.0.0.1:443", "dial tcp 10.0.0.1:443: connect: connection refused", 1.0)]
    clock.now += 1.0  # the cooldown is over: a probe starts, the endpoint stays out meanwhile
    assert all(set_.choose() is not dead for _ in range(100))
    assert probes == [dead]
    set_.probed(dead, "dial tcp 10.0.0.1:443: connect: connection refused")  # still dead: twice as long
    assert set_.ejected()[0][2] == 2.0
    clock.now += 2.0
    set_.choose()
    set_.probed(dead, "dial tcp 10.0.0.1:443: connect: connection refused")
    assert set_.ejected()[0][2] == 4.0
    clock.now += 4.0
    set_.choose()
    set_.probed(dead, None)  # it answered
    assert set_.ejected() == [] and set_.ejected_count == 0
    assert any(set_.choose() is dead for _ in range(100))


def test_the_cooldown_is_capped_and_starts_over_after_a_good_answer() -> None:
    set_, _, _ = endpoints(
        "10.0.0.1",
        "10.0.0.2",
        annotations=(
            ("aggregator.dev/outlier-ejection-time", "1s"),
            ("aggregator.dev/outlier-max-ejection-time", "3s"),
        ),
    )
    flaky = by_host(set_)["10.0.0.1"]
    cooldowns = []
    for _ in range(4):
        set_.eject(flaky, "reset")
        cooldowns.append(set_.ejected()[0][2])
        set_.probed(flaky, None)
    assert cooldowns == [1.0, 2.0, 3.0, 3.0]
    set_.answered(flaky, 200, 0.01)
    set_.eject(flaky, "reset")
    assert set_.ejected()[0][2] == 1.0


def test_consecutive_bad_answers_eject_and_a_good_one_resets_the_count() -> None:
    set_, _, _ = endpoints(
        "10.0.0.1", "10.0.0.2", annotations=(("aggregator.dev/outlier-consecutive-errors", "3"),)
    )
    sick = by_host(set_)["10.0.0.1"]
    for status in (503, 502, 200, 504, 503):
        set_.answered(sick, status, 0.01)
    assert set_.ejected() == []  # the 200 broke the run
    set_.answered(sick, 503, 0.01)
    assert set_.ejected() == [("10.0.0.1:443", "3 consecutive 503 answers", 1.0)]


def test_never_more_than_half_of_the_endpoints_are_ejected() -> None:
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")
    hosts = list(set_.all)
    assert [set_.eject(e, "refused") for e in hosts] == [True, True, False, False, False]
    single, _, _ = endpoints("10.0.0.9")
    assert not single.eject(single.all[0], "refused")  # the only one: requests still try it


def test_an_endpoint_slice_update_keeps_what_was_learned_about_the_endpoints_still_there() -> None:
    set_, _, _ = endpoints("10.0.0.1", "10.0.0.2", "10.0.0.3")
    dead = by_host(set_)["10.0.0.1"]
    set_.eject(dead, "refused")
    gone = set_.update([dest("10.0.0.1"), dest("10.0.0.2"), dest("10.0.0.4")], read_bounds(()))
    assert [e.destination.host for e in gone] == ["10.0.0.3"]
    assert by_host(set_)["10.0.0.1"] is dead and set_.ejected_count == 1
    set_.update([dest("10.0.0.2"), dest("10.0.0.4")], read_bounds(()))
    assert set_.ejected_count == 0
