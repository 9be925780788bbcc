"""The shared reflector against the fake kube-apiserver: synced once, resume, relist, backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.sources.reflector import ListWatch, Reflector, WatchMetrics, paged_list
from aggregator.util.backoff import Backoff
from aggregator.util.tasks import TaskSet
from tests.support.fakekube import FakeKube, apiservice
from tests.support.polling import until
from tests.support.ports import free_port

APISERVICES = ListWatch(
    "apiservices", paged_list(calls.LIST_APISERVICES, "apiservices"), calls.WATCH_APISERVICES
)


class Recorder:
    """A reflector target that remembers every list and event it was handed."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def replace(self, items: list[Any]) -> None:
        self.lists.append(sorted(item["metadata"]["name"] for item in items))

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self.events.append((event_type, obj["metadata"]["name"]))


class RecordedBackoff(Backoff):
    """client-go's shape without jitter, so the delays are exact; remembers each one it gave."""

    def __init__(self) -> None:
        super().__init__(0.05, 0.4, rng=lambda: 0.0)
        self.delays: list[float] = []

    def next(self) -> float:
        delay = super().next()
        self.delays.append(delay)
        return delay


class Running:
    def __init__(
        self, reflector: Reflector, target: Recorder, backoff: RecordedBackoff, registry: CollectorRegistry
    ):
        self.reflector, self.target, self.backoff, self.registry = reflector, target, backoff, registry

    def metric(self, name: str) -> float:
        value = self.registry.get_sample_value(
            f"aggregator_{name}_total", {"resource": "apiservices"}
        )
        return value or 0.0


@asynccontextmanager
async def running(kubeconfig: Path, source: ListWatch = APISERVICES) -> AsyncIterator[Running]:
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    target, backoff, registry = Recorder(), RecordedBackoff(), CollectorRegistry()
    reflector = Reflector(
        client, source, target, metrics=WatchMetrics(registry), watch_timeout=30.0, backoff=backoff
    )
    tasks = TaskSet("test-reflector")
    tasks.spawn(reflector.run(), name="reflector")
    try:
        yield Running(reflector, target, backoff, registry)
    finally:
        await tasks.close()
        await client.stop()


def watched_from(fake: FakeKube, resource: str = "apiservices") -> list[str | None]:
    return [
        r.query.get("resourceVersion") for r in fake.requests if r.verb == "watch" and r.resource == resource
    ]


async def test_synced_is_set_once_the_first_list_is_handed_over(fake_kube: FakeKube) -> None:
    assert fake_kube.kubeconfig is not None
    fake_kube.add_object("apiservices", apiservice("a.example.com"))
    fake_kube.slow(30, verb="list", resource="apiservices")
    async with running(fake_kube.kubeconfig) as r:
        await until(lambda: fake_kube.count("list", "apiservices") == 1, what="the list in flight")
        assert not r.reflector.synced.is_set()
        assert r.target.lists == []
        fake_kube.release()
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        assert r.target.lists == [["v1alpha1.a.example.com"]]
        # The watch starts exactly where the list left off.
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch")
        assert watched_from(fake_kube) == [r.reflector.resource_version]
        assert r.backoff.delays == []


async def test_a_dropped_watch_resumes_from_the_last_seen_version_without_relisting(
    fake_kube: FakeKube,
) -> None:
    assert fake_kube.kubeconfig is not None
    async with running(fake_kube.kubeconfig) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch")
        fake_kube.add_object("apiservices", apiservice("a.example.com"))
        await until(lambda: len(r.target.events) == 1, what="the live event")
        seen = r.reflector.resource_version
        assert fake_kube.drop_watches() == 1
        # Changed while the reflector was away: the resumed watch replays it.
        fake_kube.add_object("apiservices", apiservice("b.example.com"))
        await until(lambda: len(r.target.events) == 2, what="the replayed event")
        assert r.target.events == [("ADDED", "v1alpha1.a.example.com"), ("ADDED", "v1alpha1.b.example.com")]
        assert fake_kube.count("list", "apiservices") == 1
        assert r.target.lists == [[]]
        assert watched_from(fake_kube)[1] == seen
        assert r.metric("watch_restarts") == 1
        assert r.metric("watch_relists") == 0
        assert r.backoff.delays == []


async def test_bookmarks_move_the_resume_point(fake_kube: FakeKube) -> None:
    assert fake_kube.kubeconfig is not None
    async with running(fake_kube.kubeconfig) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch")
        assert fake_kube.requests[-1].query["allowWatchBookmarks"] == "true"
        fake_kube.add_object("services", {"metadata": {"name": "elsewhere", "namespace": "x"}, "spec": {}})
        assert fake_kube.send_bookmarks() == 1
        await until(lambda: r.reflector.resource_version == str(fake_kube.rv), what="the bookmark")
        fake_kube.drop_watches()
        await until(lambda: len(watched_from(fake_kube)) == 2, what="the resumed watch")
        assert watched_from(fake_kube)[1] == str(fake_kube.rv)
        assert r.target.events == []


@pytest.mark.parametrize("gone_mode", ["http", "event"])
async def test_410_gone_relists_once(fake_kube: FakeKube, gone_mode: str) -> None:
    assert fake_kube.kubeconfig is not None
    fake_kube.add_object("apiservices", apiservice("a.example.com"))
    async with running(fake_kube.kubeconfig) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch")
        fake_kube.gone_mode = gone_mode
        fake_kube.drop_watches()
        fake_kube.expire_history()
        # Changed while the reflector was away, then compacted: only a relist can see it.
        fake_kube.add_object("apiservices", apiservice("b.example.com"))
        fake_kube.expire_history()
        await until(lambda: len(r.target.lists) == 2, what="the relist")
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch again")
        assert r.target.lists[1] == ["v1alpha1.a.example.com", "v1alpha1.b.example.com"]
        assert fake_kube.count("list", "apiservices") == 2
        assert r.metric("watch_relists") == 1
        assert watched_from(fake_kube)[-1] == r.reflector.resource_version == str(fake_kube.rv)
        assert r.reflector.synced.is_set()


async def test_other_error_events_relist_after_a_backoff(fake_kube: FakeKube) -> None:
    assert fake_kube.kubeconfig is not None
    async with running(fake_kube.kubeconfig) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        await until(lambda: fake_kube.open_watches("apiservices") == 1, what="the watch")
        assert fake_kube.send_watch_error(500, "InternalError", "etcd is sad") == 1
        await until(lambda: len(r.target.lists) == 2, what="the relist")
        assert r.backoff.delays == [0.05]
        assert r.metric("watch_relists") == 1


async def test_a_refused_connection_backs_off_capped_then_syncs(tmp_path: Path) -> None:
    fake = FakeKube(tmp_path / "late", port=free_port())
    fake.add_token("t", "gateway")
    fake.add_object("apiservices", apiservice("a.example.com"))
    kubeconfig = fake.write_kubeconfig(tmp_path / "late.kubeconfig", token="t")
    try:
        async with running(kubeconfig) as r:
            await until(lambda: len(r.backoff.delays) >= 5, what="five retries")
            # Doubling from 0.05, capped at 0.4; one delay per failure, never a hot loop.
            assert r.backoff.delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.4]
            assert r.reflector.failures == len(r.backoff.delays)
            assert r.reflector.last_error is not None and f"127.0.0.1:{fake.port}" in r.reflector.last_error
            assert r.reflector.answered.is_set() and not r.reflector.synced.is_set()
            await fake.start()
            await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
            assert r.target.lists == [["v1alpha1.a.example.com"]]
            assert r.reflector.failures == 0 and r.backoff.attempt == 0
    finally:
        await fake.stop()


def named_configmap() -> ListWatch:
    """kube-system/extension-apiserver-authentication, selected by name, as the gateway reads it."""
    selector = "metadata.name=extension-apiserver-authentication"
    return ListWatch(
        "configmaps",
        paged_list(calls.LIST_CONFIGMAPS, "configmaps", namespace="kube-system", field_selector=selector),
        calls.WATCH_CONFIGMAPS,
        namespace="kube-system",
        field_selector=selector,
    )


async def test_one_named_object_absent_then_created(fake_kube: FakeKube) -> None:
    """A field-selected list of an absent object is empty; the watch from its version sees it created."""
    assert fake_kube.kubeconfig is not None
    fake_kube.delete_object("configmaps", "extension-apiserver-authentication", "kube-system")
    fake_kube.add_object("configmaps", {"metadata": {"namespace": "kube-system", "name": "other"}})
    async with running(fake_kube.kubeconfig, named_configmap()) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        assert r.target.lists == [[]]  # the other ConfigMap is not selected
        await until(lambda: fake_kube.open_watches("configmaps") == 1, what="the watch")
        watch = [q for q in fake_kube.requests if q.verb == "watch"][-1]
        assert watch.query["resourceVersion"] == str(fake_kube.rv)
        assert watch.query["fieldSelector"] == "metadata.name=extension-apiserver-authentication"
        fake_kube.add_object("configmaps", {"metadata": {"namespace": "kube-system", "name": "another"}})
        fake_kube.publish_authentication()
        await until(lambda: r.target.events != [], what="the created ConfigMap")
        assert r.target.events == [("ADDED", "extension-apiserver-authentication")]
        assert fake_kube.count("list", "configmaps") == 1


async def test_an_object_written_long_ago_is_listed_once_and_watched(fake_kube: FakeKube) -> None:
    """A real cluster's ConfigMap was written at install time, and its own resourceVersion is long
    compacted: the watch goes from the list's version, not the object's, so it is not 410 Gone."""
    assert fake_kube.kubeconfig is not None
    for i in range(3):
        fake_kube.add_object("services", {"metadata": {"namespace": "default", "name": f"churn-{i}"}})
    fake_kube.expire_history()  # every version so far is compacted, the ConfigMap's included
    async with running(fake_kube.kubeconfig, named_configmap()) as r:
        await asyncio.wait_for(r.reflector.synced.wait(), 5.0)
        await until(lambda: fake_kube.open_watches("configmaps") == 1, what="the watch")
        assert r.target.lists == [["extension-apiserver-authentication"]]
        assert fake_kube.count("list", "configmaps") == 1
        assert r.reflector.failures == 0
        fake_kube.publish_authentication(username_headers=["X-Other-User"])
        await until(lambda: r.target.events != [], what="the changed ConfigMap")
        assert r.target.events == [("MODIFIED", "extension-apiserver-authentication")]
        assert fake_kube.count("list", "configmaps") == 1 and fake_kube.count("watch", "configmaps") == 1


async def test_a_list_whose_version_is_gone_at_once_backs_off_further_each_time(fake_kube: FakeKube) -> None:
    """A lister that keeps handing out a compacted version (as a GET of one object written long ago
    does) must not relist twice a second forever: each relist waits longer, up to the cap."""
    assert fake_kube.kubeconfig is not None
    fake_kube.expire_history()

    async def stale(_client: KubeClient) -> tuple[list[Any], str]:
        return [], "1"  # compacted

    source = ListWatch("configmaps", stale, calls.WATCH_CONFIGMAPS, namespace="kube-system")
    async with running(fake_kube.kubeconfig, source) as r:
        await until(lambda: len(r.backoff.delays) >= 5, what="five relists")
        assert r.backoff.delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.4]
