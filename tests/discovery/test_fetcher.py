"""The fetcher's schedule and cache, driven through an in-memory transport."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.discovery.fetcher import DiscoveryFetcher, FetchState
from aggregator.discovery.metrics import DiscoveryMetrics
from aggregator.model.apiservice import decode_apiservice
from aggregator.model.objects import EndpointSlice, Service
from aggregator.sources.store import Kind, Store
from tests.discovery.fakes import FakeBackends, FakeResponse, Unreachable, resource, serve_aggregated
from tests.discovery.manifests import apiservice
from tests.support.logrecords import fields_of
from tests.support.polling import until


def make(store: Store, fakes: FakeBackends, **options: Any) -> tuple[DiscoveryFetcher, list[int]]:
    """A fetcher over `store`, which a source has listed (synced)."""
    store.mark_synced()
    changes: list[int] = []
    metrics = DiscoveryMetrics(CollectorRegistry())
    fetcher = DiscoveryFetcher(store, fakes, lambda: changes.append(1), metrics=metrics, **options)
    store.add_listener(fetcher.on_store_event)  # as the composition root subscribes it
    return fetcher, changes


async def test_etag_revalidation_and_periodic_refresh() -> None:
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()
    fakes.handlers["v1.a.example.com"] = serve_aggregated(
        {"a.example.com": {"v1": [resource("as", "A")]}}, etag='"X"'
    )
    fetcher, _ = make(store, fakes, refresh_interval=0.05)
    await fetcher.start()
    try:
        await until(lambda: len(fakes.calls) >= 3)
    finally:
        await fetcher.stop()
    assert "If-None-Match" not in fakes.calls[0][2]
    assert fakes.calls[1][2]["If-None-Match"] == '"X"'
    state = fetcher.states["v1.a.example.com"]
    assert state.fresh and state.resources == (resource("as", "A"),)
    assert fetcher._metrics is not None
    not_modified = fetcher._metrics.fetches.labels("v1.a.example.com", "not_modified")._value.get()
    assert not_modified >= 2


async def test_failures_back_off_exponentially_up_to_the_cap() -> None:
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()
    stamps: list[float] = []

    def failing(_path: str, _headers: Mapping[str, str]) -> Exception:
        stamps.append(time.monotonic())
        return Unreachable("connect", "connection refused")

    fakes.handlers["v1.a.example.com"] = failing
    fetcher, _ = make(store, fakes, backoff_initial=0.02, backoff_max=0.08)
    await fetcher.start()
    try:
        await until(lambda: len(stamps) >= 8)
    finally:
        await fetcher.stop()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # 0.02, 0.04, 0.08: each jittered down by at most 10%
    assert gaps[0] > 0.015
    assert gaps[1] > 0.034
    assert all(gap > 0.07 for gap in gaps[2:])
    # capped at 0.08 (uncapped: 0.32, 0.64, 1.28 by now); a stall stretches one gap, not three
    assert min(gaps[4:7]) < 0.3
    state = fetcher.states["v1.a.example.com"]
    assert not state.fresh and state.resources is None and state.last_error == "connection refused"
    assert state.entry().freshness == "Stale"


async def test_cache_is_per_apiservice_not_per_service() -> None:
    store = Store()
    for name in ("v1.a.example.com", "v2.a.example.com"):
        store.upsert(decode_apiservice(apiservice(name, 100, 10, service=("ns", "shared"))))
    fakes = FakeBackends()
    doc = {"a.example.com": {"v1": [resource("ones", "One")], "v2": [resource("twos", "Two")]}}
    fakes.handlers["v1.a.example.com"] = serve_aggregated(doc)
    fakes.handlers["v2.a.example.com"] = serve_aggregated(doc)
    fetcher, _ = make(store, fakes)
    await fetcher.start()
    try:
        await until(lambda: all(s.fresh for s in fetcher.states.values()))
    finally:
        await fetcher.stop()
    assert fetcher.states["v1.a.example.com"].resources == (resource("ones", "One"),)
    assert fetcher.states["v2.a.example.com"].resources == (resource("twos", "Two"),)


async def test_service_and_endpoint_changes_trigger_a_refetch_and_deletion_forgets() -> None:
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10, service=("ns", "svc"))))
    fakes = FakeBackends()
    fakes.handlers["v1.a.example.com"] = lambda _p, _h: FakeResponse(503)
    fetcher, changes = make(store, fakes, backoff_initial=30, backoff_max=30)
    await fetcher.start()
    try:
        await until(lambda: len(fakes.calls) == 1)
        fakes.handlers["v1.a.example.com"] = serve_aggregated({"a.example.com": {"v1": []}})
        store.upsert(Service(namespace="ns", name="svc"))
        await until(lambda: fetcher.states["v1.a.example.com"].fresh)
        calls = len(fakes.calls)
        store.upsert(EndpointSlice(namespace="ns", name="svc-abc", service_name="svc"))
        await until(lambda: len(fakes.calls) > calls)
        store.upsert(Service(namespace="ns", name="other"))  # unrelated: no fetch
        await asyncio.sleep(0.05)  # a negative check: time for a fetch that must not come
        assert len(fakes.calls) == calls + 1
        store.delete(Kind.APISERVICE, "", "v1.a.example.com")
        assert fetcher.states == {}
        assert changes
    finally:
        await fetcher.stop()


async def test_hung_backend_times_out() -> None:
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()

    async def slow(_path: str, _headers: Mapping[str, str]) -> FakeResponse:
        await asyncio.sleep(10)  # hangs past the fetch timeout
        return FakeResponse(200)

    fakes.handlers["v1.a.example.com"] = slow
    fetcher, _ = make(store, fakes, timeout=0.05, backoff_initial=10)
    await fetcher.start()
    try:
        await until(lambda: fetcher.states["v1.a.example.com"].failures >= 1, timeout=3)
    finally:
        await fetcher.stop()
    assert "did not complete within" in fetcher.states["v1.a.example.com"].last_error


async def test_nothing_is_fetched_before_the_store_has_synced() -> None:
    """A Service not listed yet is not a missing Service: fetches start once the source has listed."""
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()
    fakes.handlers["v1.a.example.com"] = serve_aggregated({"a.example.com": {"v1": []}})
    fetcher = DiscoveryFetcher(store, fakes, lambda: None)
    await fetcher.start()
    try:
        for _ in range(20):  # a negative check: loop turns for a fetch that must not come
            await asyncio.sleep(0)
        assert fakes.calls == [] and fetcher.loops.wakeups == 0  # the engine has not even started
        store.mark_synced()
        await until(lambda: fetcher.states["v1.a.example.com"].fresh)
    finally:
        await fetcher.stop()


class Verdicts:
    """`contracts.Reachability` as a test sets it."""

    def __init__(self) -> None:
        self.down: dict[str, str] = {}
        self.unchecked: set[str] = set()

    def unreachable(self, name: str) -> str | None:
        return self.down.get(name)

    def awaiting_check(self, name: str) -> bool:
        return name in self.unchecked


async def test_a_backend_the_checker_found_unreachable_is_not_dialed_until_it_is_back() -> None:
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()
    fakes.handlers["v1.a.example.com"] = serve_aggregated({"a.example.com": {"v1": [resource("as", "A")]}})
    verdicts = Verdicts()
    verdicts.down["v1.a.example.com"] = "dial tcp 10.0.0.5:443: connect: connection refused"
    fetcher, _ = make(store, fakes, backoff_initial=0.01, backoff_max=0.02)
    fetcher.reachability = verdicts
    await fetcher.start()
    try:
        state = fetcher.states["v1.a.example.com"]
        await until(lambda: state.failures >= 1)
        assert fakes.calls == []
        assert state.entry().freshness == "Stale"
        assert state.last_error == "backend unreachable: dial tcp 10.0.0.5:443: connect: connection refused"
        # no backoff while it is down: parked until the checker says it is back, not retried in 10 ms
        await asyncio.sleep(0.2)  # a negative check: time for retries that must not come
        assert state.failures == 1 and fakes.calls == []
        # the checker reaches it again and tells the fetcher (its listener): fetched at once
        del verdicts.down["v1.a.example.com"]
        fetcher.poke("v1.a.example.com")
        await until(lambda: state.fresh)
        assert len(fakes.calls) == 1
    finally:
        await fetcher.stop()


async def test_an_apiservice_is_fetched_after_its_first_check_not_beside_it() -> None:
    """At start-up the first check dials each backend first; the fetch follows its verdict (the
    checker's listener pokes it) and finds the check's connection idle, instead of a second
    handshake at the same moment."""
    store = Store()
    store.upsert(decode_apiservice(apiservice("v1.a.example.com", 100, 10)))
    fakes = FakeBackends()
    fakes.handlers["v1.a.example.com"] = serve_aggregated({"a.example.com": {"v1": [resource("as", "A")]}})
    verdicts = Verdicts()
    verdicts.unchecked.add("v1.a.example.com")
    fetcher, _ = make(store, fakes, refresh_interval=0.01, backoff_initial=0.01, backoff_max=0.02)
    fetcher.reachability = verdicts
    await fetcher.start()
    try:
        state = fetcher.states["v1.a.example.com"]
        await until(lambda: fetcher.loops.runs >= 1)
        # not dialed, and not reported as a failure: nothing is known yet
        assert fakes.calls == [] and not state.attempted
        await asyncio.sleep(0.1)  # a negative check: ten refresh intervals, for runs that must not come
        assert fetcher.loops.runs == 1 and fakes.calls == []  # parked until the verdict
        verdicts.unchecked.clear()
        fetcher.poke("v1.a.example.com")  # what the checker's listener does with the first verdict
        await until(lambda: state.fresh)
        assert len(fakes.calls) == 1
    finally:
        await fetcher.stop()


async def test_a_failure_says_last_good_only_when_there_were_good_resources(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.discovery.fetcher")
    store = Store()
    for name in ("v1.never.example.com", "v1.once.example.com"):
        store.upsert(decode_apiservice(apiservice(name, 100, 10)))
    fakes = FakeBackends()
    fakes.handlers["v1.never.example.com"] = lambda _p, _h: Unreachable("tls", "x509: unknown authority")
    fakes.handlers["v1.once.example.com"] = serve_aggregated(
        {"once.example.com": {"v1": [resource("os", "O")]}}
    )
    fetcher, _ = make(store, fakes)
    states = {svc.name: FetchState(svc) for svc in store.apiservices()}
    for state in states.values():
        await fetcher.fetch_once(state)
    fakes.handlers["v1.once.example.com"] = lambda _p, _h: Unreachable("connect", "connection refused")
    await fetcher.fetch_once(states["v1.once.example.com"])
    said = {fields_of(r)["apiservice"]: r.getMessage() for r in caplog.records}
    assert said == {
        "v1.never.example.com": "discovery fetch failed; its group-version is listed as Stale, with no "
        "resources until a fetch succeeds",
        "v1.once.example.com": "discovery fetch failed; serving the last good resources as Stale",
    }
