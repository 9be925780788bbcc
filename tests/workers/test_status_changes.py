"""A local-mode verdict written to an APIService's status reaches a worker as its new conditions
alone, and the worker's copy keeps sharing what it held (the manifest, the caBundle); anything
else about the object still goes out whole. The messages cross a real channel (pickled frames over
a socketpair) into a worker's `Replica`.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from aggregator.model.apiservice import APIService, Condition, decode_apiservice
from aggregator.sources.store import Event, Store
from aggregator.tls.issue import new_ca
from aggregator.workers.channel import Channel, encode
from aggregator.workers.messages import Hello, ObjectChange, State, StatusChange
from aggregator.workers.publisher import message_for
from aggregator.workers.replica import Replica
from tests.support.backend import apiservice_manifest

CA = new_ca("extension-servers").cert_pem
NAMES = ("v1.a.example.com", "v1.b.example.com")


def manifest(group: str) -> dict[str, object]:
    doc = apiservice_manifest(port=8443, ca_pem=CA, group=group, service=group.partition(".")[0])
    del doc["status"]
    return doc


@pytest.fixture
async def channels() -> AsyncIterator[tuple[Channel, Channel]]:
    left, right = socket.socketpair()
    control, worker = await Channel.open(left), await Channel.open(right)
    yield control, worker
    control.close()
    worker.close()


async def test_a_status_write_reaches_the_worker_as_its_conditions_and_keeps_what_was_shared(
    channels: tuple[Channel, Channel],
) -> None:
    control_end, worker_end = channels
    store = Store()
    events: list[Event] = []
    store.add_listener(events.append)
    for name in NAMES:
        store.upsert(decode_apiservice(manifest(name.partition(".")[2])))
    replica = Replica(worker_end, Hello(0, 1, "hop", ()), collect=list)
    control_end.send(State(snapshot=True, objects=list(store.apiservices()), revision=store.revision))
    replica.apply(await worker_end.receive())
    held = replica.store.apiservice(NAMES[0])
    assert held is not None
    # one caBundle, held once by the worker as by the control (decoded once, pickled once)
    other = replica.store.apiservice(NAMES[1])
    assert other is not None and held.ca_bundle is other.ca_bundle
    assert held.raw["spec"]["caBundle"] is other.raw["spec"]["caBundle"]

    condition = Condition("Available", "False", "2026-11-28T05:00:00Z", "FailedDiscoveryCheck", "refused")
    event = store.set_apiservice_conditions(NAMES[0], (condition,))
    assert event is not None
    message = message_for(event)
    assert isinstance(message, StatusChange)
    whole = ObjectChange(event.kind, event.obj, "", NAMES[0], event.revision)
    assert len(encode(message)) * 3 < len(encode(whole))
    control_end.send(message)
    replica.apply(await worker_end.receive())

    control_copy, worker_copy = store.apiservice(NAMES[0]), replica.store.apiservice(NAMES[0])
    assert isinstance(worker_copy, APIService) and control_copy is not None
    assert worker_copy == control_copy and worker_copy.raw == control_copy.raw
    assert worker_copy.conditions == (condition,)
    assert worker_copy.raw is held.raw and worker_copy.ca_bundle is held.ca_bundle
    assert replica.store.revision == store.revision


def test_a_changed_manifest_goes_out_whole() -> None:
    store = Store()
    events: list[Event] = []
    store.add_listener(events.append)
    store.upsert(decode_apiservice(manifest("a.example.com")))
    changed = manifest("a.example.com")
    changed["spec"]["versionPriority"] = 20  # type: ignore[index]
    event = store.upsert(decode_apiservice(changed))
    assert event is not None
    message = message_for(event)
    assert isinstance(message, ObjectChange) and message.obj is event.obj
