"""The writer thread: order, draining on stop, failures counted, and never a wait on the request path."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from aggregator.audit.event import Event
from aggregator.audit.policy import Level, Stage, parse_policy
from aggregator.audit.recorder import AuditMetrics, Auditor
from aggregator.audit.writer import BufferedWriter
from aggregator.model.userinfo import UserInfo
from tests.audit.support import T0, info_of, mocked_request, policy_for


class MemorySink:
    def __init__(self, fail_first: int = 0) -> None:
        self.lines: list[bytes] = []
        self.closed = False
        self._fail = fail_first

    def write(self, data: bytes) -> None:
        if self._fail:
            self._fail -= 1
            raise OSError(28, "No space left on device")
        self.lines.append(data)

    def close(self) -> None:
        self.closed = True


class StalledSink(MemorySink):
    """Blocks every write until released, like a hung disk or a stopped log reader on a pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, data: bytes) -> None:
        self.entered.set()
        self.release.wait(60)
        super().write(data)


def event(n: int) -> Event:
    return Event(Level.METADATA, f"id-{n}", Stage.RESPONSE_COMPLETE, f"/x/{n}", "get", None, T0, T0)


def encode(ev: Event) -> bytes:
    return ev.audit_id.encode() + b"\n"


def errors(registry: CollectorRegistry, plugin: str) -> float:
    return registry.get_sample_value("apiserver_audit_error_total", {"plugin": plugin}) or 0.0


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> AuditMetrics:
    return AuditMetrics(registry)


@pytest.fixture
def stalled() -> Iterator[StalledSink]:
    sink = StalledSink()
    yield sink
    sink.release.set()


def test_lines_are_written_in_order(metrics: AuditMetrics) -> None:
    sink = MemorySink()
    writer = BufferedWriter(sink, metrics.errors, encode=encode)
    writer.start()
    for n in range(50):
        assert writer.submit(event(n))
    assert writer.wait_idle(10)
    assert sink.lines == [f"id-{n}\n".encode() for n in range(50)]
    assert writer.stop()
    assert sink.closed


def test_stop_writes_everything_queued_first(metrics: AuditMetrics, registry: CollectorRegistry) -> None:
    sink = MemorySink()
    writer = BufferedWriter(sink, metrics.errors, encode=encode)
    for n in range(20):  # queued before the thread exists
        writer.submit(event(n))
    writer.start()
    assert writer.stop(timeout=10)
    assert len(sink.lines) == 20 and sink.closed
    assert not writer.submit(event(99))  # after stop: dropped and counted, as upstream after shutdown
    assert errors(registry, "buffered") == 1


def test_write_failures_are_counted_and_the_writer_carries_on(
    metrics: AuditMetrics, registry: CollectorRegistry
) -> None:
    sink = MemorySink(fail_first=2)
    writer = BufferedWriter(sink, metrics.errors, encode=encode)
    writer.start()
    for n in range(5):
        writer.submit(event(n))
    assert writer.wait_idle(10)
    assert sink.lines == [b"id-2\n", b"id-3\n", b"id-4\n"]
    assert errors(registry, "log") == 2
    writer.stop()


def test_an_event_that_cannot_be_encoded_is_counted(
    metrics: AuditMetrics, registry: CollectorRegistry
) -> None:
    def broken(ev: Event) -> bytes:
        raise ValueError("boom")

    writer = BufferedWriter(MemorySink(), metrics.errors, encode=broken)
    writer.start()
    writer.submit(event(0))
    assert writer.wait_idle(10)
    assert errors(registry, "log") == 1
    writer.stop()


def test_a_stuck_writer_does_not_hold_stop_forever(metrics: AuditMetrics, stalled: StalledSink) -> None:
    writer = BufferedWriter(stalled, metrics.errors, encode=encode)
    writer.start()
    writer.submit(event(0))
    assert stalled.entered.wait(10)
    started = time.monotonic()
    assert not writer.stop(timeout=0.2)
    assert time.monotonic() - started < 5
    assert not stalled.closed  # never closed under a writer that may still use it


def test_a_stalled_writer_never_slows_begin_or_complete(
    metrics: AuditMetrics, registry: CollectorRegistry, stalled: StalledSink
) -> None:
    """A full queue drops the event (apiserver_audit_error_total{plugin="buffered"}) instead of waiting."""
    writer = BufferedWriter(stalled, metrics.errors, buffer_size=2)
    audit = Auditor(parse_policy(policy_for("Metadata")), writer, metrics)
    audit.start()
    user = UserInfo("alice")
    first = mocked_request("GET", "/api/v1/namespaces/a/pods")
    assert audit.begin(first, user, info_of(first)) is not None
    assert stalled.entered.wait(10)  # the writer holds event 1 and is stuck in write()

    requests = [mocked_request("GET", f"/api/v1/namespaces/a/pods/p{n}") for n in range(50)]
    infos = [info_of(r) for r in requests]

    def burst() -> None:
        for request, info in zip(requests, infos, strict=True):
            recorded = audit.begin(request, user, info)
            assert recorded is not None
            recorded.complete(200)

    worker = threading.Thread(target=burst, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "begin/complete waited for the stalled writer"
    assert time.monotonic() - started < 5
    assert registry.get_sample_value("apiserver_audit_event_total") == 101
    assert errors(registry, "buffered") == 98  # two fit in the queue

    stalled.release.set()
    assert audit.stop(timeout=10)
    assert len(stalled.lines) == 3
