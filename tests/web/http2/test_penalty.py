"""Flood penalties (`penalty.py`, `tarpit.py`): an address whose HTTP/2 connection was cut for a
flood has its next connections held until the penalty ends, a few at most (more are closed at
once); other addresses are served as before; the penalty doubles while the address keeps
flooding, up to a cap, and starts again from the first after a quiet period."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import RstStreamFrame
from prometheus_client import CollectorRegistry

from aggregator.runners.server import GatewayServer
from aggregator.web.http2.metrics import PenaltyMetrics
from aggregator.web.http2.penalty import FloodPenalty, Penalties
from tests.support.fixtures import StartProxied
from tests.support.h2client import H2Client, RawH2
from tests.support.pki import PKI
from tests.support.polling import until
from tests.workers.group import Group, running_group

pytestmark = [pytest.mark.long(30), pytest.mark.uvloop]

# Long enough that a loaded machine gets the test's next connections in before it ends.
PENALTY = 6.0


def penalised(server: GatewayServer, outcome: str) -> int:
    value = server.gateway.metrics.registry.get_sample_value(
        "aggregator_http2_penalised_connections_total", {"outcome": outcome}
    )
    return int(value or 0)


async def served_at(port: int, pki: PKI) -> float:
    """A connection from 127.0.0.1 gets a 200 for /livez: when."""
    async with H2Client.connect(port, pki.client_context("admin"), local="127.0.0.1") as client:
        assert (await client.get("/livez")).status == 200
    return time.monotonic()


async def flood_once(port: int, pki: PKI, local: str) -> RawH2:
    """One connection from `local` opening and resetting 200 streams at once, until its GOAWAY."""
    async with RawH2.connect(port, pki.client_context("admin"), local=local) as flood:
        frames: list[bytes | RstStreamFrame] = []
        for n in range(200):
            frames += [
                flood.headers(2 * n + 1, "GET", "/version"),
                RstStreamFrame(2 * n + 1, error_code=ErrorCodes.CANCEL),
            ]
        flood.send(*frames)
        await flood.until(lambda: flood.goaway is not None)
    return flood


async def test_a_flooding_address_waits_and_another_address_does_not(
    start_proxied: StartProxied, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.web.http2.tarpit")
    proxied = await start_proxied()
    server, port = proxied.server, proxied.server.port
    server.penalties.policy = FloodPenalty(first=PENALTY, longest=PENALTY, held_per_address=2)
    started = time.monotonic()  # the penalty starts later than this, so it ends later than + PENALTY
    flood = await flood_once(port, pki, "127.0.0.1")
    assert flood.goaway is not None and flood.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    # Another address is served, neither held nor refused.
    async with H2Client.connect(port, pki.client_context("admin"), local="127.0.0.2") as other:
        assert (await other.get("/livez")).status == 200
    assert (penalised(server, "delayed"), penalised(server, "refused")) == (0, 0)
    # The flooder's address: two connections held...
    held = [asyncio.create_task(served_at(port, pki)) for _ in range(2)]
    await until(lambda: penalised(server, "delayed") == 2, what="two connections held")
    assert not any(task.done() for task in held)
    # ...a third and a fourth closed at once, unserved, and logged once (refusals come in floods).
    for _ in range(2):
        with pytest.raises(AssertionError, match="closed"):
            async with RawH2.connect(port, pki.client_context("admin"), local="127.0.0.1") as third:
                await third.until(lambda: third.goaway is not None)
    assert penalised(server, "refused") == 2
    refusals = [r for r in caplog.records if "penalised for a flood refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    # Another address is still served while they wait.
    async with H2Client.connect(port, pki.client_context("admin"), local="127.0.0.2") as other:
        assert (await other.get("/livez")).status == 200
    # The held ones are served once the penalty is over, not before.
    served = await asyncio.gather(*held)
    assert min(served) - started >= PENALTY
    # It is over: the address is served at once again.
    await served_at(port, pki)
    assert (penalised(server, "delayed"), penalised(server, "refused")) == (2, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def penalties(clock: Clock, held: int = 8) -> Penalties:
    policy = FloodPenalty(first=1.0, longest=30.0, quiet=60.0, held_per_address=held)
    return Penalties(policy, PenaltyMetrics(CollectorRegistry()), clock)


def test_the_penalty_doubles_while_the_address_floods_up_to_the_cap() -> None:
    clock = Clock()
    book = penalties(clock)
    lengths = []
    for _ in range(7):
        book.penalise("10.0.0.1")
        lengths.append(book.penalty("10.0.0.1"))
        clock.now += book.penalty("10.0.0.1")  # the next flood gets in when the penalty ends
    assert lengths == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert book.penalty("10.0.0.2") == 0.0


def test_a_cut_during_the_penalty_does_not_lengthen_it() -> None:
    clock = Clock()
    book = penalties(clock)
    book.penalise("10.0.0.1")
    clock.now += 0.5
    book.penalise("10.0.0.1")  # a connection that got in before the penalty
    assert book.penalty("10.0.0.1") == 1.0
    assert book.admit("10.0.0.1") == pytest.approx(0.5)


def test_the_penalty_starts_again_from_the_first_after_a_quiet_period() -> None:
    clock = Clock()
    book = penalties(clock)
    book.penalise("10.0.0.1")
    clock.now += 1.0
    book.penalise("10.0.0.1")
    assert book.penalty("10.0.0.1") == 2.0
    clock.now += 2.0 + 60.0
    book.penalise("10.0.0.1")
    assert book.penalty("10.0.0.1") == 1.0


def test_connections_are_held_up_to_the_bound_then_refused_and_none_once_it_ends() -> None:
    clock = Clock()
    book = penalties(clock, held=2)
    book.penalise("10.0.0.1")
    assert [book.admit("10.0.0.1") for _ in range(3)] == [1.0, 1.0, None]
    book.release("10.0.0.1")
    assert book.admit("10.0.0.1") == 1.0
    assert book.admit("10.0.0.2") == 0.0
    clock.now += 1.0
    assert book.admit("10.0.0.1") == 0.0


async def test_connections_held_when_the_server_closes_are_closed_unserved(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    server, port = proxied.server, proxied.server.port
    server.penalties.policy = FloodPenalty(first=60.0, longest=60.0)
    async with RawH2.connect(port, pki.client_context("admin"), local="127.0.0.1") as flood:
        frames: list[bytes | RstStreamFrame] = []
        for n in range(200):
            sid = 2 * n + 1
            frames += [
                flood.headers(sid, "GET", "/version"),
                RstStreamFrame(sid, error_code=ErrorCodes.CANCEL),
            ]
        flood.send(*frames)
        await flood.until(lambda: flood.goaway is not None)
    async with RawH2.connect(port, pki.client_context("admin"), local="127.0.0.1") as held:
        await until(lambda: penalised(server, "delayed") == 1, what="the connection held")
        await server.stop(request_grace=0)
        with pytest.raises(AssertionError, match="closed"):
            await held.until(lambda: held.goaway is not None)
        assert held.goaway is None  # never served: not even the server's SETTINGS


async def test_with_the_default_workers_a_flooder_reconnecting_is_held_and_another_address_served(
    pki: PKI, tmp_path: Path
) -> None:
    """The shipped configuration: `--workers` unset (one worker per CPU), each worker with its own
    penalties. A flooder that keeps reconnecting is held by a worker that cut it (the kernel spreads
    its connections, so it may get into each worker once), and another address is served at once."""
    apiservices = tmp_path / "apiservices"
    apiservices.mkdir()

    async def held(group: Group) -> int:
        status, body = await group.get("/metrics")
        assert status == 200
        found = re.search(
            r'^aggregator_http2_penalised_connections_total\{outcome="delayed"\} (\S+)$', body.decode(), re.M
        )
        return int(float(found.group(1))) if found else 0

    async with running_group(pki, apiservices, tmp_path / "serve.log") as group:
        for _ in range(40):  # (each connection lands on a worker at random: 40 misses are 2^-39)
            flood = await flood_once(group.port, pki, "127.0.0.1")
            assert flood.goaway is not None and flood.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
            if await held(group):
                break
        assert await held(group) >= 1, group.log()
        count = await held(group)
        for _ in range(4):  # whichever worker it lands on
            async with H2Client.connect(group.port, pki.client_context("admin"), local="127.0.0.2") as other:
                assert (await other.get("/livez")).status == 200
        assert await held(group) == count
