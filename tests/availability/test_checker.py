"""The checker: its rate limit on the proxy's suspicions (one check per APIService per second, none
lost), and what it logs when a verdict changes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from aggregator.availability.checker import AvailabilityChecker
from aggregator.availability.conditions import endpoints_not_found, failed_discovery_check, passed
from aggregator.availability.probe import Report
from aggregator.availability.status import MemoryStatus
from aggregator.sources.store import Kind
from tests.availability.support import Harness
from tests.support.backend import APISERVICE, apiservice_manifest
from tests.support.logrecords import fields_of


@dataclass
class RecordingLoops:
    """Stands in for the loop engine: which checks the checker asked for, and when."""

    tracked: set[str]
    asked: list[tuple[str, str, float]] = field(default_factory=list)
    now: float = 0.0

    def __contains__(self, key: object) -> bool:
        return key in self.tracked

    def poke(self, key: str) -> None:
        self.asked.append(("now", key, self.now))

    def poke_within(self, key: str, delay: float) -> None:
        self.asked.append(("at", key, round(self.now + delay, 6)))


def test_suspicions_are_rate_limited_per_apiservice_and_never_lost(harness: Harness) -> None:
    loops = RecordingLoops({"v1.a.example.com", "v1.b.example.com"})
    checker = AvailabilityChecker(
        harness.store, harness.probe, harness.metrics, MemoryStatus(), timer=lambda: loops.now
    )
    harness.store.add_listener(checker.on_store_event)
    # A recording stand-in, deliberately not a KeyedLoops: the test reads what the checker asked of it.
    checker.loops = loops  # type: ignore[assignment]

    def suspect_at(now: float, name: str = "v1.a.example.com") -> None:
        loops.now = now
        checker.suspect(name)

    suspect_at(0.0)  # checked at once
    suspect_at(0.3)  # within the second: one check at its end
    suspect_at(0.5)  # already covered by that one
    suspect_at(0.6, "v1.b.example.com")  # another APIService has its own budget
    suspect_at(1.0)  # while the trailing check runs: the next one a second later
    suspect_at(3.5)  # long after: at once again
    suspect_at(9.0, "kube-apiserver")  # not an APIService being checked
    assert loops.asked == [
        ("now", "v1.a.example.com", 0.0),
        ("at", "v1.a.example.com", 1.0),
        ("now", "v1.b.example.com", 0.6),
        ("at", "v1.a.example.com", 2.0),
        ("now", "v1.a.example.com", 3.5),
    ]


async def test_a_change_of_reason_is_logged_as_well_as_a_flip(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """EndpointsNotFound, then FailedDiscoveryCheck once the pods are up but not answering: still
    unavailable, but the next thing to fix moved, so the log says so (upstream logs every change)."""
    caplog.set_level(logging.INFO, logger="aggregator.availability.checker")
    harness.add(apiservice_manifest(port=443, ca_pem=None, available=True))  # stored: True, Passed
    svc = harness.store.apiservice(APISERVICE)
    assert svc is not None and svc.service is not None
    checker = AvailabilityChecker(harness.store, harness.probe, harness.metrics, MemoryStatus())
    for verdict in (
        endpoints_not_found(svc.service),
        endpoints_not_found(svc.service),  # the same again: nothing to say
        failed_discovery_check("failing or missing response from https://10.0.0.2:443/apis/g/v", []),
        passed(),
    ):
        await checker.record(Report(APISERVICE, verdict))
    lines = [
        (
            r.getMessage(),
            fields_of(r).get("old_status") or fields_of(r).get("old_reason"),
            fields_of(r)["reason"],
        )
        for r in caplog.records
    ]
    assert lines == [
        ("APIService availability changed", "True", "EndpointsNotFound"),
        ("APIService availability reason changed", "EndpointsNotFound", "FailedDiscoveryCheck"),
        ("APIService availability changed", "False", "Passed"),
    ]


async def test_an_apiservice_awaits_its_first_check_until_its_verdict(harness: Harness) -> None:
    """`awaiting_check` (what the discovery fetcher and the OpenAPI downloads ask before they
    dial): true from start-up until the first verdict, false after it, and false when no checker
    runs or the APIService is gone."""
    harness.add(apiservice_manifest(port=443, ca_pem=None, available=True))
    checker = AvailabilityChecker(harness.store, harness.probe, harness.metrics, MemoryStatus())
    checker.interval = 3600.0  # one check at start, no other
    assert not checker.awaiting_check(APISERVICE)  # not running: callers dial themselves
    checker.loops.concurrency = 0  # the first check stays queued while the test looks
    await checker.start()  # the store is not synced: nothing is checked yet
    try:
        assert checker.awaiting_check(APISERVICE)
        harness.store.mark_synced()
        await checker.stop()
        await checker.start()  # local mode: the store was synced before the checker started
        assert checker.awaiting_check(APISERVICE)
        svc = harness.store.apiservice(APISERVICE)
        assert svc is not None and svc.service is not None
        await checker.record(Report(APISERVICE, endpoints_not_found(svc.service)))
        assert not checker.awaiting_check(APISERVICE)
        deleted = harness.store.delete(Kind.APISERVICE, "", APISERVICE)
        assert deleted is not None
        checker.on_store_event(deleted)
        assert not checker.awaiting_check(APISERVICE)
    finally:
        await checker.stop()
