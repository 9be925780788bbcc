"""The issue's scenario, not timed: a total concurrency of 4 (`--max-requests-inflight 3
--max-mutating-requests-inflight 1`), alice sending 32 GETs at a time, bob one at a time. Every one
of bob's requests is served while alice's flood is held back (queued, or refused once her queues are
full), never bob; over HTTP/1.1 and HTTP/2, in one process and with `--workers 2`, where the two
workers together never run more of the level's requests than its one seat.

The level is the operator's (lendable 0, borrowing 0: one seat whatever the load), so what is
asserted does not depend on the borrowing adjustment's 10 s period (benchmarks/fairness.py measures
the bootstrap configuration)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.flowcontrol.client import PROTOCOLS, Answer, Client, client
from tests.flowcontrol.support import flow_schema, priority_level
from tests.support.backend import PREFIX, FakeBackend, wait_available, write_manifests
from tests.support.fixtures import StartProxied
from tests.support.pki import PKI
from tests.workers.group import running_group

THINGS = f"{PREFIX}/namespaces/default/things"
ALICE_AT_ONCE = 32
BOB_REQUESTS = 30


class Counting:
    """A backend route that takes 5 ms and remembers the most requests it ever had at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def __call__(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.005)
            return web.json_response({"kind": "ThingList", "items": []})
        finally:
            self.in_flight -= 1


def configure(apiservices_dir: Path) -> None:
    write_manifests(
        apiservices_dir,
        "apf",
        priority_level("tenants", shares=30, lendable=0, borrowing=0, queues=64, hand_size=6, queue_length_limit=50),
        flow_schema("tenants", "tenants", users=("alice", "bob")),
    )


async def flood(as_alice: Client, stop: asyncio.Event, answers: list[int]) -> None:
    async def one_after_another() -> None:
        while not stop.is_set():
            answers.append((await as_alice.request("GET", THINGS)).status)

    await asyncio.gather(*(one_after_another() for _ in range(ALICE_AT_ONCE)))


async def scenario(as_alice: Client, as_bob: Client, backend: Counting) -> tuple[list[Answer], list[int]]:
    stop = asyncio.Event()
    alice: list[int] = []
    flooding = asyncio.create_task(flood(as_alice, stop, alice))
    bob: list[Answer] = []
    try:
        while backend.most < 1 or len(alice) < ALICE_AT_ONCE:  # alice's flood is on
            await asyncio.sleep(0.01)
        for _ in range(BOB_REQUESTS):
            bob.append(await as_bob.request("GET", THINGS))
    finally:
        stop.set()
        await flooding
    return bob, alice


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_bob_is_served_while_alices_flood_waits_its_turn(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, protocol: str
) -> None:
    configure(apiservices_dir)
    proxied = await start_proxied(max_requests_inflight=3, max_mutating_requests_inflight=1)
    counting = Counting()
    proxied.backend.routes[THINGS] = counting
    alice, bob = pki.issue_user("alice", "alice"), pki.issue_user("bob", "bob")
    port = proxied.server.port
    async with client(pki, port, protocol, alice) as as_alice, client(pki, port, protocol, bob) as as_bob:
        bobs, alices = await scenario(as_alice, as_bob, counting)
    assert [a.status for a in bobs] == [200] * BOB_REQUESTS
    assert set(alices) <= {200, 429} and alices.count(200) > 0
    assert counting.most == 1  # the level's one seat: alice's other 31 waited (or were refused)
    sample = proxied.server.gateway.metrics.registry.get_sample_value
    waited = sample(
        "apiserver_flowcontrol_request_wait_duration_seconds_sum",
        {"priority_level": "tenants", "flow_schema": "tenants", "execute": "true"},
    )
    assert waited is not None and waited > 0


@contextlib.asynccontextmanager
async def counted_backend(backend: FakeBackend) -> AsyncIterator[Counting]:
    counting = Counting()
    backend.routes[THINGS] = counting
    yield counting


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_with_two_workers_the_group_runs_no_more_than_the_levels_seats(
    start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, tmp_path: Path, backend: FakeBackend, protocol: str
) -> None:
    configure(apiservices_dir)
    proxied = await start_proxied()  # writes the APIService for the backend; the group below serves it
    await wait_available(proxied.server)
    await proxied.server.stop()
    alice, bob = pki.issue_user("alice", "alice"), pki.issue_user("bob", "bob")
    async with (
        running_group(
            pki,
            apiservices_dir,
            tmp_path / "group.log",
            "--workers",
            "2",
            "--max-requests-inflight",
            "3",
            "--max-mutating-requests-inflight",
            "1",
        ) as group,
        counted_backend(backend) as counting,
        client(pki, group.port, protocol, alice) as as_alice,
        client(pki, group.port, protocol, bob) as as_bob,
    ):
        for _ in range(50):  # the APIService is available in every worker
            if (await as_bob.request("GET", THINGS)).status == 200:
                break
            await asyncio.sleep(0.1)
        counting.most = 0
        bobs, alices = await scenario(as_alice, as_bob, counting)
    assert [a.status for a in bobs] == [200] * BOB_REQUESTS, [a.status for a in bobs]
    assert set(alices) <= {200, 429} and alices.count(200) > 0
    assert counting.most == 1  # one seat for the group, not one per worker
