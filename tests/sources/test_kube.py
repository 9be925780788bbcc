"""Kube mode's object source against the fake kube-apiserver: events, 410s, drops, bookmarks, backoff."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from aggregator.kube.client import KubeClient
from aggregator.sources.kube import KubeSource
from aggregator.sources.reflector import WatchMetrics
from aggregator.sources.store import Event, Kind, Store, Subscription
from tests.conftest import StartGateway
from tests.support.fakekube import (
    FakeKube,
    apiservice,
    endpointslice,
    kube_options,
    running_fake_kube,
    service,
)
from tests.support.gateway import running_gateway
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port

RESOURCES = ("apiservices", "services", "endpointslices")


class Harness:
    """A KubeSource on a fresh store, a subscriber recording every store event, and the metrics."""

    def __init__(self, fake: FakeKube, kubeconfig: Path, **source_args: float) -> None:
        self.fake = fake
        self.client = KubeClient.from_kubeconfig(str(kubeconfig))
        self.store = Store()
        self.registry = CollectorRegistry()
        args: dict[str, Any] = {"watch_timeout": 30.0, "backoff_initial": 0.05, "backoff_cap": 0.5}
        args.update(source_args)
        self.source = KubeSource(self.client, self.store, WatchMetrics(self.registry), **args)
        self.subscription: Subscription = self.store.subscribe()
        self.seen: list[tuple[str, str, str]] = []
        self._collector: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._collector = asyncio.create_task(self._collect())
        await self.source.start()

    async def _collect(self) -> None:
        async for event in self.subscription:
            self.seen.append(describe(event))

    async def stop(self) -> None:
        await self.source.stop()
        await self.client.stop()
        if self._collector is not None:
            self._collector.cancel()

    def metric(self, name: str, resource: str) -> float:
        value = self.registry.get_sample_value(f"aggregator_{name}_total", {"resource": resource})
        return value or 0.0

    async def synced(self) -> None:
        await asyncio.wait_for(self.store.wait_synced(), 10.0)
        # All three watches open again, so what the test does next is seen live or replayed.
        await until(lambda: self.fake.open_watches() == 3, what="three open watches")

    def clear(self) -> None:
        self.seen.clear()


def describe(event: Event) -> tuple[str, str, str]:
    return (event.type, event.kind.value, event.obj.name)


@pytest.fixture
async def harness(fake_kube: FakeKube) -> AsyncIterator[Harness]:
    assert fake_kube.kubeconfig is not None
    h = Harness(fake_kube, fake_kube.kubeconfig)
    await h.start()
    yield h
    await h.stop()


async def test_add_change_remove_each_kind_within_two_seconds(harness: Harness) -> None:
    fake, store = harness.fake, harness.store
    await harness.synced()
    fake.add_object("apiservices", apiservice())
    fake.add_object("services", service())
    fake.add_object("endpointslices", endpointslice())
    await until(lambda: store.apiservice("v1alpha1.wardle.example.com") is not None)
    await until(lambda: store.service("wardle", "api") is not None)
    await until(lambda: len(store.endpointslices_for("wardle", "api")) == 1)

    fake.update_object("apiservices", apiservice(version_priority=99))
    fake.update_object("services", service(cluster_ip="10.0.0.99"))
    fake.update_object("endpointslices", endpointslice(addresses=("10.1.0.6", "10.1.0.7")))
    await until(
        lambda: getattr(store.apiservice("v1alpha1.wardle.example.com"), "version_priority", None) == 99
    )
    await until(lambda: getattr(store.service("wardle", "api"), "cluster_ip", None) == "10.0.0.99")
    await until(
        lambda: (
            store.endpointslices_for("wardle", "api")[0].endpoints[0].addresses == ("10.1.0.6", "10.1.0.7")
        )
    )

    fake.delete_object("apiservices", "v1alpha1.wardle.example.com")
    fake.delete_object("services", "api", "wardle")
    fake.delete_object("endpointslices", "api-abc", "wardle")
    await until(lambda: not store.apiservices() and not store.objects(Kind.SERVICE))
    await until(lambda: not store.endpointslices_for("wardle", "api"))
    svc = harness.store
    assert svc.revision == 9
    assert [s[0] for s in harness.seen] == ["ADDED"] * 3 + ["MODIFIED"] * 3 + ["DELETED"] * 3


async def test_initial_list_fills_the_store_and_marks_it_synced(fake_kube: FakeKube) -> None:
    fake_kube.add_object("apiservices", apiservice())
    fake_kube.add_object(
        "apiservices", apiservice("metrics.k8s.io", "v1beta1", service=("kube-system", "ms"))
    )
    fake_kube.add_object("services", service())
    fake_kube.add_object("endpointslices", endpointslice())
    assert fake_kube.kubeconfig is not None
    h = Harness(fake_kube, fake_kube.kubeconfig)
    assert not h.store.synced
    await h.start()
    try:
        await h.synced()
        assert sorted(a.name for a in h.store.apiservices()) == [
            "v1alpha1.wardle.example.com",
            "v1beta1.metrics.k8s.io",
        ]
        # List items come without apiVersion/kind; the stored raw object has them back.
        found = h.store.apiservice("v1beta1.metrics.k8s.io")
        assert found is not None
        raw = found.raw
        assert raw["kind"] == "APIService" and raw["apiVersion"] == "apiregistration.k8s.io/v1"
        assert h.store.service("wardle", "api") is not None
        assert [s.name for s in h.store.endpointslices_for("wardle", "api")] == ["api-abc"]
        for resource in RESOURCES:
            assert fake_kube.count("list", resource) == 1
            assert h.metric("watch_relists", resource) == 0
        watch = next(r for r in fake_kube.requests if r.verb == "watch" and r.resource == "apiservices")
        assert watch.query["allowWatchBookmarks"] == "true"
        assert watch.query["watch"] == "true"
        assert 30 <= int(watch.query["timeoutSeconds"]) <= 33
        assert watch.query["resourceVersion"] == str(fake_kube.rv)
    finally:
        await h.stop()


async def test_large_lists_are_paged(fake_kube: FakeKube) -> None:
    for i in range(1001):
        fake_kube.add_object("services", service("bulk", f"svc-{i:04d}"))
    assert fake_kube.kubeconfig is not None
    h = Harness(fake_kube, fake_kube.kubeconfig)
    await h.start()
    try:
        await h.synced()
        assert len(h.store.objects(Kind.SERVICE)) == 1001
        assert fake_kube.count("list", "services") == 3
        pages = [r.query for r in fake_kube.requests if r.verb == "list" and r.resource == "services"]
        assert [p.get("continue") is not None for p in pages] == [False, True, True]
        assert all(p["limit"] == "500" for p in pages)
    finally:
        await h.stop()


@pytest.mark.parametrize("abort", [True, False], ids=["connection-reset", "clean-end"])
async def test_dropped_watch_resumes_without_losing_or_repeating_events(
    harness: Harness, abort: bool
) -> None:
    fake = harness.fake
    listed_rv = fake.add_object("apiservices", apiservice("a.example.com"))["metadata"]["resourceVersion"]
    await harness.synced()
    seen_rv = fake.add_object("apiservices", apiservice("c.example.com"))["metadata"]["resourceVersion"]
    # the subscriber's task records an event after the store has it
    await until(lambda: len(harness.store.apiservices()) == 2 and len(harness.seen) == 2)
    assert harness.seen == [
        ("ADDED", "APIService", "v1alpha1.a.example.com"),
        ("ADDED", "APIService", "v1alpha1.c.example.com"),
    ]
    harness.clear()
    # Drop every watch and change things before the reflectors can reconnect (no await in between).
    assert fake.drop_watches(abort=abort) == 3
    fake.add_object("apiservices", apiservice("b.example.com"))
    fake.update_object("apiservices", apiservice("a.example.com", version_priority=50))
    fake.delete_object("apiservices", "v1alpha1.c.example.com")
    fake.add_object("services", service())
    await until(lambda: len(harness.seen) == 4, what="four events")
    await until(lambda: fake.open_watches() == 3, what="watches reopened")
    # And live events keep flowing on the resumed watch.
    fake.add_object("apiservices", apiservice("d.example.com"))
    await until(lambda: len(harness.seen) == 5, what="five events")
    await asyncio.sleep(0.1)  # a negative check: time for a duplicate event that must not come
    # The two resources are separate streams: each one's order is exact, their interleaving is not.
    assert [e for e in harness.seen if e[1] == "APIService"] == [
        ("ADDED", "APIService", "v1alpha1.b.example.com"),
        ("MODIFIED", "APIService", "v1alpha1.a.example.com"),
        ("DELETED", "APIService", "v1alpha1.c.example.com"),
        ("ADDED", "APIService", "v1alpha1.d.example.com"),
    ]
    assert [e for e in harness.seen if e[1] != "APIService"] == [("ADDED", "Service", "api")]
    found = harness.store.apiservice("v1alpha1.a.example.com")
    assert found is not None and found.version_priority == 50
    for resource in RESOURCES:
        assert fake.count("list", resource) == 1, f"{resource} relisted"
        assert fake.count("watch", resource) == 2
        assert harness.metric("watch_restarts", resource) == 1
        assert harness.metric("watch_relists", resource) == 0
    # Each resumed watch asked for exactly the last resourceVersion its reflector had seen.
    resumed = {r.resource: r.query["resourceVersion"] for r in fake.requests if r.verb == "watch"}
    assert resumed == {"apiservices": seen_rv, "services": listed_rv, "endpointslices": listed_rv}


@pytest.mark.parametrize("form", ["http-410", "error-event-on-rewatch", "error-event-on-open-watch"])
async def test_a_410_causes_exactly_one_relist(harness: Harness, form: str) -> None:
    fake = harness.fake
    fake.add_object("apiservices", apiservice("a.example.com"))
    fake.add_object("apiservices", apiservice("gone.example.com"))
    await harness.synced()
    await until(lambda: len(harness.store.apiservices()) == 2)
    harness.clear()
    if form == "error-event-on-open-watch":
        fake.expire_history()
        fake.add_object("apiservices", apiservice("b.example.com"))
        fake.delete_object("apiservices", "v1alpha1.gone.example.com")
        # The open watches already got those two events; now the server says their RV is gone.
        await until(lambda: len(harness.seen) == 2, what="live events")
        assert fake.send_watch_error(410) == 3
    else:
        fake.gone_mode = "http" if form == "http-410" else "event"
        fake.drop_watches()
        fake.expire_history()
        # Changed while the reflectors were away, and then compacted: only a relist can see them.
        fake.add_object("apiservices", apiservice("b.example.com"))
        fake.delete_object("apiservices", "v1alpha1.gone.example.com")
        fake.expire_history()
    await until(lambda: all(fake.count("list", r) == 2 for r in RESOURCES), what="one relist each")
    await until(lambda: fake.open_watches() == 3, what="watches reopened")
    await asyncio.sleep(0.2)  # a negative check: time for a second relist that must not come
    for resource in RESOURCES:
        assert fake.count("list", resource) == 2, resource
        assert fake.count("watch", resource) == (2 if form == "error-event-on-open-watch" else 3), resource
        assert harness.metric("watch_relists", resource) == 1, resource
    assert sorted(a.name for a in harness.store.apiservices()) == [
        "v1alpha1.a.example.com",
        "v1alpha1.b.example.com",
    ]
    # The relist emitted only the differences: nothing for the unchanged APIService.
    assert sorted(harness.seen) == [
        ("ADDED", "APIService", "v1alpha1.b.example.com"),
        ("DELETED", "APIService", "v1alpha1.gone.example.com"),
    ]


async def test_other_error_events_relist_after_a_backoff(harness: Harness) -> None:
    fake = harness.fake
    await harness.synced()
    assert fake.send_watch_error(500, "InternalError", "etcd is sad") == 3
    await until(lambda: all(fake.count("list", r) == 2 for r in RESOURCES), what="relists")
    for resource in RESOURCES:
        assert harness.metric("watch_relists", resource) == 1


async def test_bookmarks_advance_the_resource_version(tmp_path: Path) -> None:
    """After a bookmark, a resumed watch starts past history that was compacted meanwhile."""
    async with running_fake_kube(tmp_path / "fk", history=5) as fake:
        assert fake.kubeconfig is not None
        h = Harness(fake, fake.kubeconfig)
        await h.start()
        try:
            await h.synced()
            listed_rv = fake.rv
            # Ten Service changes push everything the APIService watch could resume from out of history.
            for i in range(10):
                fake.add_object("services", service("churn", f"s{i}"))
            await until(lambda: len(h.seen) == 10, what="service events")
            apiservices = h.source.reflector("apiservices")
            assert apiservices.resource_version == str(listed_rv)
            assert fake.send_bookmarks() == 3
            await until(lambda: apiservices.resource_version == str(fake.rv), what="bookmark applied")
            slices = h.source.reflector("endpointslices")
            await until(lambda: slices.resource_version == str(fake.rv), what="bookmark applied")
            fake.drop_watches()
            await until(lambda: fake.count("watch", "apiservices") == 2, what="rewatch")
            await until(lambda: fake.open_watches() == 3, what="watches reopened")
            assert fake.count("list", "apiservices") == 1  # no 410, no relist
            assert h.metric("watch_relists", "apiservices") == 0
            assert len(h.seen) == 10  # a bookmark is not a change
        finally:
            await h.stop()


async def test_without_a_bookmark_the_same_gap_costs_a_relist(tmp_path: Path) -> None:
    """The control for the test above: it is the bookmark that avoided the relist."""
    async with running_fake_kube(tmp_path / "fk", history=5) as fake:
        assert fake.kubeconfig is not None
        h = Harness(fake, fake.kubeconfig)
        await h.start()
        try:
            await h.synced()
            for i in range(10):
                fake.add_object("services", service("churn", f"s{i}"))
            await until(lambda: len(h.seen) == 10, what="service events")
            fake.drop_watches()
            await until(lambda: fake.count("list", "apiservices") == 2, what="relist")
            assert fake.count("list", "services") == 1  # its events kept it current
        finally:
            await h.stop()


async def test_refused_connection_backs_off_then_syncs_when_the_server_appears(tmp_path: Path) -> None:
    port = free_port()
    fake = FakeKube(tmp_path / "late", port=port)
    fake.add_token("t", "gateway")
    fake.add_object("apiservices", apiservice())
    kubeconfig = fake.write_kubeconfig(tmp_path / "late.kubeconfig", token="t")
    h = Harness(fake, kubeconfig, backoff_initial=0.05, backoff_cap=0.4)
    await h.start()
    try:
        reflector = h.source.reflector("apiservices")
        # The delays themselves (0.05 -> 0.1 -> 0.2 -> 0.4, the cap) are the reflector's test's
        # (tests/sources/test_reflector.py); here: the source keeps trying and says why.
        await until(lambda: reflector.failures >= 3, what="three refused tries")
        assert not h.store.synced
        assert reflector.last_error is not None and f"127.0.0.1:{port}" in reflector.last_error
        await fake.start()
        await asyncio.wait_for(h.store.wait_synced(), 10.0)  # only a failing run waits it out
        assert h.store.apiservice("v1alpha1.wardle.example.com") is not None
        assert reflector.failures == 0
    finally:
        await h.stop()
        await fake.stop()


async def test_unauthorized_keeps_retrying_until_credentials_work(
    fake_kube: FakeKube, tmp_path: Path
) -> None:
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "late-token.kubeconfig", token="later")
    h = Harness(fake_kube, kubeconfig)
    await h.start()
    try:
        await until(lambda: fake_kube.unauthorized >= 6, what="retries")
        assert not h.store.synced
        assert "401" in (h.source.reflector("apiservices").last_error or "")
        fake_kube.add_token("later", "gateway")
        await asyncio.wait_for(h.store.wait_synced(), 10.0)  # only a failing run waits it out
    finally:
        await h.stop()


async def test_malformed_objects_are_logged_and_skipped(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    fake = harness.fake
    await harness.synced()
    caplog.set_level(logging.ERROR, logger="aggregator.sources.kube")
    good = apiservice("good.example.com")
    fake.add_object("apiservices", good)
    await until(lambda: harness.store.apiservice("v1alpha1.good.example.com") is not None)
    broken = apiservice("bad.example.com")
    broken["spec"]["groupPriorityMinimum"] = "high"
    fake.add_object("apiservices", broken)
    # A MODIFIED event that breaks a known object keeps its previous version.
    worse = apiservice("good.example.com")
    worse["spec"]["service"]["port"] = "https"
    fake.update_object("apiservices", worse)
    fake.add_object("apiservices", apiservice("after.example.com"))
    await until(lambda: harness.store.apiservice("v1alpha1.after.example.com") is not None)
    assert harness.store.apiservice("v1alpha1.bad.example.com") is None
    kept = harness.store.apiservice("v1alpha1.good.example.com")
    assert kept is not None and kept.service is not None and kept.service.port == 443
    messages = [(r.getMessage(), fields_of(r)) for r in caplog.records]
    assert len(messages) == 2
    assert messages[0][1]["name"] == "v1alpha1.bad.example.com"
    assert "spec.groupPriorityMinimum" in messages[0][1]["reason"]
    assert messages[1][1]["name"] == "v1alpha1.good.example.com"
    assert "spec.service.port" in messages[1][1]["reason"]
    # A relist keeps the previous version too, and the watch goes on after it.
    fake.send_watch_error(410)
    await until(lambda: fake.count("list", "apiservices") == 2, what="relist")
    await until(lambda: fake.open_watches() == 3, what="watches reopened")
    kept = harness.store.apiservice("v1alpha1.good.example.com")
    assert kept is not None and kept.service is not None and kept.service.port == 443
    assert harness.store.apiservice("v1alpha1.bad.example.com") is None


# --- through a real gateway ----------------------------------------------------------------------


async def get(url: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=ctx) as response:
        return response.status, await response.text()


async def test_readyz_waits_for_the_first_sync_in_kube_mode(fake_kube: FakeKube, pki: PKI) -> None:
    assert fake_kube.kubeconfig is not None
    fake_kube.add_object("apiservices", apiservice())
    fake_kube.slow(30, verb="list", resource="apiservices")
    options = kube_options(pki, fake_kube.kubeconfig)
    ctx = pki.client_context("admin")
    async with running_gateway(options) as server:
        assert server.gateway.kube is not None
        await until(lambda: fake_kube.count("list", "apiservices") == 1, what="list sent")
        status, body = await get(f"{server.url}/readyz?verbose", ctx)
        assert status == 500
        assert "[-]apiservice-registry-synced failed: reason withheld" in body
        status, _ = await get(f"{server.url}/readyz/apiservice-registry-synced", ctx)
        assert status == 500
        status, _ = await get(f"{server.url}/livez", ctx)
        assert status == 200
        fake_kube.release()
        await asyncio.wait_for(server.gateway.store.wait_synced(), 2.0)
        # Then the first availability verdicts (instant here: the APIService's Service is missing).
        checker = server.gateway.control.availability
        await until(lambda: checker.verdict("v1alpha1.wardle.example.com") is not None, what="verdict")
        # And kube-apiserver's OpenAPI, downloaded once the objects are listed (404s here: answered).
        await until(lambda: server.gateway.control.openapi.kube_ready() is None, what="kube-apiserver's OpenAPI")
        status, body = await get(f"{server.url}/readyz?verbose", ctx)
        assert status == 200, body
        assert "[+]apiservice-registry-synced ok" in body
        assert server.gateway.store.apiservice("v1alpha1.wardle.example.com") is not None
    # Stopping the gateway closed the watches and the client's session.
    await until(lambda: fake_kube.open_watches() == 0, what="watches closed")
    assert server.gateway.kube._session is None


async def test_gateway_serves_while_kube_apiserver_is_unreachable(pki: PKI, tmp_path: Path) -> None:
    port = free_port()
    fake = FakeKube(tmp_path / "never", port=port)
    kubeconfig = fake.write_kubeconfig(tmp_path / "never.kubeconfig", token="t")
    async with running_gateway(kube_options(pki, kubeconfig)) as server:
        status, body = await get(f"{server.url}/readyz?verbose", pki.client_context("admin"))
        assert status == 500 and "[-]apiservice-registry-synced failed" in body
        status, _ = await get(f"{server.url}/healthz/ping", pki.client_context("admin"))
        assert status == 200


async def test_local_mode_with_kubeconfig_gets_a_client_but_no_watch(
    fake_kube: FakeKube, start_gateway: StartGateway
) -> None:
    assert fake_kube.kubeconfig is not None
    server = await start_gateway(kubeconfig=str(fake_kube.kubeconfig))
    assert server.gateway.kube is not None
    assert server.gateway.control.kube_source is None
    await asyncio.sleep(0.2)  # a negative check: time for a list or watch that must not come
    assert fake_kube.requests == []
