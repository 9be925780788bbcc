"""Merging every process's families into the group's `/metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from aggregator.workers.metrics import Merged, merge


def _registry(requests: float, inflight: float, rss: float, expiry: float) -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    Counter("demo_requests", "h", ["code"], registry=r).labels("200").inc(requests)
    Gauge("demo_current_inflight_requests", "h", registry=r).set(inflight)
    Gauge("process_resident_memory_bytes", "h", registry=r).set(rss)
    Counter("process_cpu_seconds", "h", registry=r).inc(rss / 100)
    Gauge("demo_certificate_expiry_seconds", "h", registry=r).set(expiry)
    Histogram("demo_duration_seconds", "h", buckets=(1.0,), registry=r).observe(0.5 * requests)
    return r


def test_counters_and_in_flight_sum_process_gauges_are_labelled_facts_come_from_the_control() -> None:
    control = _registry(0, 0, 100, 7)
    one, two = _registry(3, 1, 50, 8), _registry(4, 2, 60, 9)
    text = generate_latest(
        Merged(merge([("control", control.collect()), ("0", one.collect()), ("1", two.collect())]))
    ).decode()
    assert 'demo_requests_total{code="200"} 7.0' in text
    assert "demo_current_inflight_requests 3.0" in text
    assert 'process_resident_memory_bytes{worker="control"} 100.0' in text
    assert 'process_resident_memory_bytes{worker="0"} 50.0' in text
    assert 'process_resident_memory_bytes{worker="1"} 60.0' in text
    # A process counter is per process too: the CPU of each, not their sum.
    assert 'process_cpu_seconds_total{worker="control"} 1.0' in text
    assert 'process_cpu_seconds_total{worker="0"} 0.5' in text
    assert 'process_cpu_seconds_total{worker="1"} 0.6' in text
    assert "process_cpu_seconds_total 2.1" not in text
    assert "demo_certificate_expiry_seconds 7.0" in text
    assert "demo_duration_seconds_count 3.0" in text  # one observation per process
    assert "demo_duration_seconds_sum 3.5" in text
    assert 'demo_duration_seconds_bucket{le="1.0"} 1.0' in text  # 1.5 and 2.0 are above the bucket
    assert text.count("# TYPE demo_requests_total counter") == 1
