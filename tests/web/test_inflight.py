"""--max-requests-inflight and --max-mutating-requests-inflight through the running gateway, with a
backend that holds every request until the test lets it go (max-in-flight is kube-apiserver's
limiter with --enable-priority-and-fairness=false; with APF on, tests/flowcontrol covers it)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from aggregator.model.userinfo import UserInfo
from aggregator.web.inflight import MaxInFlight
from aggregator.web.requestmetrics import RequestMetrics
from aggregator.web.serverrequest import Response
from tests.support.backend import GROUP, PREFIX, VERSION
from tests.support.contexts import context_for
from tests.support.fixtures import Proxied, StartProxied
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"
# A broken gateway fails the test instead of hanging it.
LIMIT = aiohttp.ClientTimeout(total=10)
TOO_MANY = b"Too many requests, please try again later.\n"


class Holding:
    """Backend handlers that answer only once `release` is set; `arrived` counts by method."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        key = "WATCH" if "watch=" in request.query_string else request.method
        self.arrived[key] = self.arrived.get(key, 0) + 1
        if key == "WATCH":
            out = web.StreamResponse(headers={"Content-Type": "application/json"})
            await out.prepare(request)
            await self.release.wait()
            await out.write_eof()
            return out
        await self.release.wait()
        return web.json_response({"kind": "ThingList", "items": []})


async def _call(proxied: Proxied, method: str, path: str, cert: str) -> tuple[int, bytes, Any]:
    async with proxied.request(method, path, cert=cert, timeout=LIMIT) as resp:
        return resp.status, await resp.read(), resp.headers


@pytest.fixture
def alice(pki: PKI) -> str:
    return pki.issue_user("alice", "alice", ("devs",))


async def test_past_the_limit_a_get_is_429_at_once_and_watches_do_not_count(
    start_proxied: StartProxied, alice: str
) -> None:
    proxied = await start_proxied(
        max_requests_inflight=2, max_mutating_requests_inflight=1, enable_priority_and_fairness=False
    )
    holding = Holding()
    proxied.backend.routes[THINGS] = holding.handle
    calls: list[asyncio.Task[tuple[int, bytes, Any]]] = []
    # three watches first: long-running, so they take no place
    for _ in range(3):
        calls.append(asyncio.create_task(_call(proxied, "GET", THINGS + "?watch=1", alice)))
    await until(lambda: holding.arrived.get("WATCH") == 3, what="the watches at the backend")
    for _ in range(2):
        calls.append(asyncio.create_task(_call(proxied, "GET", THINGS, alice)))
    await until(lambda: holding.arrived.get("GET") == 2, what="two GETs held by the backend")

    status, body, headers = await _call(proxied, "GET", THINGS, alice)  # answered before any release
    assert (status, body) == (429, TOO_MANY)
    assert headers["Retry-After"] == "1"
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert holding.arrived["GET"] == 2

    # mutating requests have their own limit: the first POST goes through, the second is refused
    calls.append(asyncio.create_task(_call(proxied, "POST", THINGS, alice)))
    await until(lambda: holding.arrived.get("POST") == 1, what="a POST held by the backend")
    status, body, _ = await _call(proxied, "POST", THINGS, alice)
    assert (status, body) == (429, TOO_MANY)

    # system:masters is never refused
    calls.append(asyncio.create_task(_call(proxied, "GET", THINGS, "admin")))
    await until(lambda: holding.arrived.get("GET") == 3, what="the admin's GET at the backend")

    holding.release.set()
    assert sorted(status for status, _, _ in await asyncio.gather(*calls)) == [200] * 7
    sample = proxied.server.gateway.metrics.registry.get_sample_value
    labels = {"group": GROUP, "version": VERSION, "resource": "things", "subresource": ""}
    listed = {**labels, "verb": "LIST", "scope": "namespace", "component": "apiserver", "code": "429"}
    created = {**labels, "verb": "POST", "scope": "resource", "component": "apiserver", "code": "429"}
    assert sample("apiserver_request_total", {**listed, "dry_run": ""}) == 1
    assert sample("apiserver_request_terminations_total", listed) == 1
    assert sample("apiserver_request_terminations_total", created) == 1
    # every place was given back
    assert proxied.server.gateway.metrics.apiserver.inflight.executing("readOnly") == 0
    assert proxied.server.gateway.metrics.apiserver.inflight.executing("mutating") == 0


async def test_zero_disables_the_limit(start_proxied: StartProxied, alice: str) -> None:
    proxied = await start_proxied(max_requests_inflight=0, enable_priority_and_fairness=False)
    holding = Holding()
    proxied.backend.routes[THINGS] = holding.handle
    calls = [asyncio.create_task(_call(proxied, "GET", THINGS, alice)) for _ in range(5)]
    await until(lambda: holding.arrived.get("GET") == 5, what="five GETs held by the backend")
    holding.release.set()
    assert [status for status, _, _ in await asyncio.gather(*calls)] == [200] * 5


async def test_the_limit_counts_without_waiting() -> None:
    """Under the limit the gate answers without suspending: a counter, never a semaphore."""

    limits = MaxInFlight(RequestMetrics(CollectorRegistry()), read_only=1, mutating=1)
    ctx = context_for("GET", THINGS)
    assert limits.gate(ctx) is None  # answered by the gate itself: nothing to await
    assert limits.metrics.inflight.executing("readOnly") == 1
    limits.finished(ctx, None, None)
    assert limits.metrics.inflight.executing("readOnly") == 0


def test_a_flood_of_refusals_is_one_log_line_naming_the_flag(caplog: pytest.LogCaptureFixture) -> None:
    """The first refusal is logged at once; the ones right after it wait for the next line (10 s)."""
    caplog.set_level(logging.WARNING, logger="aggregator.web.inflight")
    limits = MaxInFlight(RequestMetrics(CollectorRegistry()), read_only=1, mutating=1)
    alice = UserInfo("alice", groups=("system:authenticated",))
    admitted = context_for("GET", THINGS, user=alice)
    assert limits.gate(admitted) is None
    refused = [limits.gate(context_for("GET", THINGS, user=alice)) for _ in range(5)]
    assert [answer.status for answer in refused if isinstance(answer, Response)] == [429] * 5
    lines = [r for r in caplog.records if r.name == "aggregator.web.inflight"]
    assert [r.getMessage() for r in lines] == ["too many requests in flight; answering 429"]
    assert fields_of(lines[0]) == {"kind": "readOnly", "limit": 1, "flag": "--max-requests-inflight", "refused": 1}
