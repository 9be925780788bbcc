"""The discovery quarantine's book: when an annotated APIService enters and leaves it, what its
gauge, log and condition line say. Time is a fake clock and a fake timer: nothing sleeps."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.availability.quarantine import DiscoveryQuarantine, QuarantineMetrics
from aggregator.model.apiservice import decode_apiservice
from aggregator.sources.store import Kind, Store
from tests.support.logrecords import fields_of

NAME = "v1beta1.metrics.k8s.io"
ANNOTATION = "aggregator.dev/discovery-quarantine-after"


def metrics_apiservice(annotations: dict[str, str] | None = None, *, local: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100}
    if not local:
        spec["service"] = {"namespace": "kube-system", "name": "metrics-server"}
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": NAME, "annotations": annotations or {}},
        "spec": spec,
    }  # fmt: skip


@dataclass
class FakeTime:
    """A clock and `call_later` that only move when the test says so."""

    now: float = 1000.0
    timers: list[tuple[float, Callable[[], None], list[bool]]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def schedule(self, delay: float, callback: Callable[[], None]) -> Any:
        cancelled = [False]
        self.timers.append((self.now + delay, callback, cancelled))

        class Handle:
            def cancel(self) -> None:
                cancelled[0] = True

        return Handle()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now and not t[2][0]]
        self.timers = [t for t in self.timers if t not in due]
        for _, callback, _ in due:
            callback()

    @property
    def armed(self) -> int:
        return sum(1 for t in self.timers if not t[2][0])


class Book:
    def __init__(self, annotations: dict[str, str] | None = None, *, local: bool = False) -> None:
        self.store = Store()
        self.store.upsert(decode_apiservice(metrics_apiservice(annotations, local=local)))
        self.registry = CollectorRegistry()
        self.time = FakeTime()
        self.heard: list[str] = []
        self.quarantine = DiscoveryQuarantine(
            self.store, QuarantineMetrics(self.registry), clock=self.time.clock, schedule=self.time.schedule
        )
        self.store.add_listener(self.quarantine.on_store_event)
        self.quarantine.add_listener(self.heard.append)

    def gauge(self) -> float | None:
        return self.registry.get_sample_value("aggregator_apiservice_discovery_quarantined", {"apiservice": NAME})

    def annotate(self, annotations: dict[str, str]) -> None:
        self.store.upsert(decode_apiservice(metrics_apiservice(annotations)))


def test_without_the_annotation_an_unavailable_apiservice_is_never_quarantined() -> None:
    book = Book()
    book.quarantine.observe(NAME, False)
    book.time.advance(10**6)
    assert book.quarantine.quarantined == frozenset() and book.time.armed == 0
    assert book.gauge() is None and book.heard == []
    assert book.quarantine.describe(NAME, False) is None


def test_unavailable_for_the_annotated_time_enters_and_available_leaves_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.availability.quarantine")
    book = Book({ANNOTATION: "30s"})
    book.quarantine.observe(NAME, True)
    assert book.gauge() == 0 and book.time.armed == 0  # watched, nothing to count
    book.quarantine.observe(NAME, False)
    assert book.quarantine.describe(NAME, False) == (
        f"leaves discovery and OpenAPI after 30s unavailable ({ANNOTATION}=30s)"
    )
    book.time.advance(20)
    book.quarantine.observe(NAME, False)  # every retry's verdict: the count goes on from the first
    book.time.advance(9.5)
    assert book.quarantine.quarantined == frozenset() and book.heard == []
    book.time.advance(0.5)
    assert book.quarantine.quarantined == {NAME} and book.heard == [NAME] and book.gauge() == 1
    line = book.quarantine.describe(NAME, False)
    assert line is not None and line.startswith("quarantined: left out of discovery and OpenAPI since 20")
    assert line.endswith(f"({ANNOTATION}=30s)")
    entered = next(r for r in caplog.records if r.message.startswith("APIService quarantined"))
    assert entered.levelno == logging.WARNING
    assert fields_of(entered)["apiservice"] == NAME and fields_of(entered)["unavailable_seconds"] == 30.0

    book.quarantine.observe(NAME, False)
    assert book.heard == [NAME] and book.time.armed == 0  # still in: nothing new
    assert book.quarantine.describe(NAME, True) is None  # the verdict being recorded ends it
    book.quarantine.observe(NAME, True)
    assert book.quarantine.quarantined == frozenset() and book.heard == [NAME, NAME] and book.gauge() == 0
    left = next(r for r in caplog.records if r.message.startswith("APIService out of quarantine"))
    assert fields_of(left)["reason"] == "the APIService is Available again"

    # A new outage counts from its own start.
    book.quarantine.observe(NAME, False)
    book.time.advance(29)
    assert book.quarantine.quarantined == frozenset()
    book.time.advance(1)
    assert book.quarantine.quarantined == {NAME}


def test_a_shorter_limit_applies_to_the_outage_under_way_and_a_removed_annotation_ends_it() -> None:
    book = Book({ANNOTATION: "10m"})
    book.quarantine.observe(NAME, False)
    book.time.advance(120)
    assert book.quarantine.quarantined == frozenset()
    book.annotate({ANNOTATION: "1m"})  # already down for 2 minutes: in at once
    assert book.quarantine.quarantined == {NAME} and book.gauge() == 1
    book.annotate({})
    assert book.quarantine.quarantined == frozenset() and book.heard == [NAME, NAME]
    assert book.gauge() is None  # no annotation, no series


def test_a_deleted_apiservice_leaves_and_loses_its_series() -> None:
    book = Book({ANNOTATION: "1s"})
    book.quarantine.observe(NAME, False)
    book.time.advance(1)
    assert book.quarantine.quarantined == {NAME}
    book.store.delete(Kind.APISERVICE, "", NAME)
    assert book.quarantine.quarantined == frozenset() and book.gauge() is None


@pytest.mark.parametrize("value", ["soon", "0s", "-1m"])
def test_a_bad_value_quarantines_nothing(value: str) -> None:
    book = Book({ANNOTATION: value})
    book.quarantine.observe(NAME, False)
    book.time.advance(10**6)
    assert book.quarantine.quarantined == frozenset() and book.gauge() is None


def test_a_local_apiservice_is_never_watched() -> None:
    book = Book({ANNOTATION: "1s"}, local=True)
    book.quarantine.observe(NAME, False)
    book.time.advance(10)
    assert book.quarantine.quarantined == frozenset() and book.gauge() is None
