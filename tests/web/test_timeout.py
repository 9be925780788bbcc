"""--request-timeout, `?timeout=` and --min-request-timeout through the running gateway."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from aggregator.web.timeout import TIMEOUT_BODY, watch_timeout
from aggregator.wire.gourl import parse_query
from tests.support.backend import GROUP, PREFIX, VERSION
from tests.support.fixtures import StartProxied
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"
# A broken gateway fails the test instead of hanging it.
LIMIT = aiohttp.ClientTimeout(total=10)


async def _never(request: web.Request) -> web.StreamResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _event(n: int) -> bytes:
    return json.dumps({"type": "ADDED", "object": {"n": n}}).encode() + b"\n"


async def test_a_slow_backend_past_the_request_timeout_is_504(start_proxied: StartProxied) -> None:
    proxied = await start_proxied(request_timeout=0.3)
    proxied.backend.routes[THINGS] = _never
    async with proxied.request("GET", THINGS, timeout=LIMIT) as resp:
        assert resp.status == 504
        assert await resp.read() == TIMEOUT_BODY
        assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert json.loads(TIMEOUT_BODY) == {
        "metadata": {},
        "status": "Failure",
        "message": "Timeout: request did not complete within the allotted timeout",
        "reason": "Timeout",
        "details": {},
        "code": 504,
    }
    terminated = proxied.server.gateway.metrics.registry.get_sample_value(
        "apiserver_request_terminations_total",
        {
            "verb": "LIST",
            "group": GROUP,
            "version": VERSION,
            "resource": "things",
            "subresource": "",
            "scope": "namespace",
            "component": "apiserver",
            "code": "504",
        },
    )
    assert terminated == 1


async def test_a_shorter_timeout_query_applies(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()  # --request-timeout 60s
    proxied.backend.routes[THINGS] = _never
    started = time.monotonic()
    async with proxied.request("GET", THINGS + "?timeout=300ms", timeout=LIMIT) as resp:
        assert resp.status == 504
        assert await resp.read() == TIMEOUT_BODY
    assert time.monotonic() - started >= 0.3


async def test_a_bad_timeout_query_is_400(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", THINGS + "?timeout=30") as resp:
        assert resp.status == 400
        body = await resp.json()
    assert body["reason"] == "BadRequest"
    assert (
        body["message"]
        == 'invalid timeout specified in the request URL - time: missing unit in duration "30"'
    )
    assert proxied.backend.seen_by("admin") == []


async def test_an_answer_already_started_is_cut_at_the_deadline(start_proxied: StartProxied) -> None:
    proxied = await start_proxied(request_timeout=0.3)

    async def slow_body(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await out.write(b'{"kind":"ThingList","items":[')
        await asyncio.Event().wait()
        return out

    proxied.backend.routes[THINGS] = slow_body
    async with proxied.request("GET", THINGS, timeout=LIMIT) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_a_watch_is_not_cut_by_the_request_timeout(start_proxied: StartProxied) -> None:
    proxied = await start_proxied(request_timeout=0.2, min_request_timeout=0)
    second = asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await out.write(_event(1))
        await second.wait()
        await out.write(_event(2))
        await out.write_eof()
        return out

    proxied.backend.routes[THINGS] = watch
    async with proxied.request("GET", THINGS + "?watch=true", timeout=LIMIT) as resp:
        assert resp.status == 200
        assert await resp.content.readline() == _event(1)
        opened = time.monotonic()
        await until(lambda: time.monotonic() - opened > 0.5, what="well past --request-timeout")
        second.set()
        assert await resp.read() == _event(2)


async def test_a_watch_without_timeout_seconds_ends_cleanly_after_min_request_timeout(
    start_proxied: StartProxied,
) -> None:
    proxied = await start_proxied(min_request_timeout=0.3)
    proxied.server.gateway.timeouts.rand = lambda: 0.0  # the deadline is exactly the minimum
    backend_done = asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await out.write(_event(1))
        try:
            await asyncio.Event().wait()
        finally:
            backend_done.set()
        return out

    proxied.backend.routes[THINGS] = watch
    started = time.monotonic()
    async with proxied.request("GET", THINGS + "?watch=1", timeout=LIMIT) as resp:
        assert resp.status == 200
        # the chunked answer ends properly (no ClientPayloadError): client-go simply re-watches
        assert await resp.read() == _event(1)
    assert time.monotonic() - started >= 0.3
    await until(backend_done.is_set, what="the backend's watch to be closed")


def test_watch_timeout_follows_handle_watch() -> None:
    # no timeoutSeconds (or 0): minRequestTimeout * (1 + rand), in [min, 2 * min)
    assert watch_timeout(parse_query("watch=1"), 1800, lambda: 0.0) == 1800
    timeout = watch_timeout(parse_query("watch=1"), 1800, lambda: 0.999999)
    assert timeout is not None and 1800 <= timeout < 3600
    assert watch_timeout(parse_query("watch=1&timeoutSeconds=0"), 1800, lambda: 0.5) == 2700
    # timeoutSeconds wins, whatever the flag
    assert watch_timeout(parse_query("watch=1&timeoutSeconds=42"), 1800, lambda: 0.5) == 42
    assert watch_timeout(parse_query("timeoutSeconds=42"), 0, lambda: 0.5) == 42
    # --min-request-timeout=0 and no timeoutSeconds: no deadline; values the backend refuses: its business
    assert watch_timeout(parse_query("watch=1"), 0, lambda: 0.5) is None
    assert watch_timeout(parse_query("timeoutSeconds=x"), 1800, lambda: 0.5) is None
    assert watch_timeout(parse_query("timeoutSeconds=-1"), 1800, lambda: 0.5) is None
