"""Dead and unreachable backends cost almost nothing: one verdict per backend, shared by the
checks, the discovery fetches and the OpenAPI downloads; one attempt per retry of a backend known
down; no log line, traceback or exception chain per failed attempt; and everything resumes as
soon as the backend is back.

A local-mode gateway with a fast checker (retries capped at 0.3 s) over one APIService whose
backend refuses connections (nothing listens on its port), or accepts them and never answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from aggregator.assembly import Gateway, build_gateway
from aggregator.backends.errors import BackendError
from aggregator.config import complete
from aggregator.model.userinfo import AGGREGATOR
from aggregator.runners.server import GatewayServer
from tests.availability.conftest import StartBackend
from tests.support.backend import (
    NAMESPACE,
    BackendPKI,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.gateway import local_options
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port

NAME = "v1.dead.example.com"
PREFIX = "/apis/dead.example.com/v1"
WATCHED = ("aggregator.availability", "aggregator.discovery", "aggregator.openapi", "aggregator.backends")


@dataclass
class Dead:
    gateway: Gateway
    port: int

    def sample(self, family: str, **labels: str) -> float:
        value = self.gateway.metrics.registry.get_sample_value(family, labels)
        return value or 0.0

    def background_attempts(self) -> float:
        """Discovery fetches and OpenAPI downloads that went out (failed or not)."""
        return sum(
            self.sample("aggregator_discovery_fetches_total", apiservice=NAME, result=result)
            for result in ("error", "aggregated", "legacy", "not_modified")
        ) + sum(
            self.sample("aggregator_openapi_fetches_total", source=f"{NAMESPACE}/dead:{self.port}", document=d, result=r)
            for d in ("v2", "v3")
            for r in ("error", "ok", "not_found", "not_modified")
        )


StartDead = Callable[[], Awaitable[Dead]]


class Silent(asyncio.Protocol):
    """Accepts the connection and never says a word (a hung pod, a firewall that drops)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


@pytest.fixture
async def start_dead(pki: PKI, apiservices_dir: Path, backend_pki: BackendPKI) -> AsyncIterator[StartDead]:
    async with AsyncExitStack() as stack:

        async def start() -> Dead:
            port = free_port()
            docs = [
                apiservice_manifest(
                    port=port, ca_pem=backend_pki.ca.cert_pem, group="dead.example.com", service="dead"
                ),
                service_manifest(port=port, name="dead"),
                endpointslice_manifest("dead-1", [("127.0.0.1", True)], port=port, service="dead"),
            ]
            del docs[0]["status"]
            (apiservices_dir / "dead.yaml").write_text(yaml.safe_dump_all(docs))
            options = local_options(pki, str(apiservices_dir))
            config = complete(options)
            gateway = build_gateway(config)
            gateway.control.availability.interval, gateway.control.availability.retry_initial = 0.3, 0.05
            gateway.control.availability.probe.timeout = 0.5
            server = GatewayServer(config, gateway)
            await server.start()
            stack.push_async_callback(server.stop)
            return Dead(gateway, port)

        yield start


async def verdict_in(dead: Dead) -> None:
    """The first verdict, and the start-up OpenAPI v2 merge (a debug line of its own, which a
    loaded machine can delay into the window where a test expects no line at all)."""
    await until(lambda: dead.gateway.control.availability.unreachable(NAME) is not None, what="the first verdict")
    await until(lambda: dead.sample("aggregator_openapi_v2_merges_total") >= 1, what="the start-up v2 merge")


async def test_a_refusing_backend_is_dialed_by_the_checker_alone_and_logs_once(
    start_dead: StartDead, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dead = await start_dead()
    checker = dead.gateway.control.availability
    await verdict_in(dead)
    assert "connection refused" in (checker.unreachable(NAME) or "")
    # the first fetches may have gone out before the verdict; none after it
    await until(lambda: checker.checks >= 3, what="retries")
    attempts, checks = dead.background_attempts(), checker.checks
    records = len([r for r in caplog.records if r.name.startswith(WATCHED)])
    await until(lambda: checker.checks >= checks + 5, what="five more retries")
    assert dead.background_attempts() == attempts
    # five failed checks of a backend known down: not one log line, at any level
    later = [r for r in caplog.records if r.name.startswith(WATCHED)][records:]
    assert later == [], [r.getMessage() for r in later]
    assert [r for r in caplog.records if r.exc_info] == []
    # the state change was logged once, by the checker
    changed = [r for r in caplog.records if r.getMessage() == "APIService availability changed"]
    assert len(changed) == 1
    # discovery shows the checker's word without having dialed
    state = dead.gateway.control.discovery.fetcher.states[NAME]
    assert state.entry().freshness == "Stale"


async def test_discovery_and_openapi_wait_for_the_first_check_and_never_dial_a_dead_backend(
    start_dead: StartDead,
) -> None:
    """At start-up the check dials first; the fetches follow its verdict, which here says
    unreachable: not one discovery fetch or OpenAPI download goes out, before or after it."""
    dead = await start_dead()
    checker = dead.gateway.control.availability
    await verdict_in(dead)
    await until(lambda: checker.checks >= 3, what="retries")
    assert dead.background_attempts() == 0
    state = dead.gateway.control.discovery.fetcher.states[NAME]
    assert state.entry().freshness == "Stale"
    assert state.last_error.startswith("backend unreachable: ")


async def test_a_failed_fetch_carries_no_exception_chain(start_dead: StartDead) -> None:
    dead = await start_dead()
    svc = dead.gateway.store.apiservice(NAME)
    assert svc is not None
    with pytest.raises(BackendError) as caught:
        await dead.gateway.backends.fetch(svc, PREFIX, headers={}, user=AGGREGATOR, timeout=2.0)
    err = caught.value
    assert "connect: connection refused" in str(err)
    assert err.__cause__ is None and err.__context__ is None


async def test_a_known_down_backend_gets_one_attempt_per_retry_even_when_it_hangs(
    start_dead: StartDead, caplog: pytest.LogCaptureFixture
) -> None:
    dead = await start_dead()
    checker = dead.gateway.control.availability
    connections = 0

    def accept() -> Silent:
        nonlocal connections
        connections += 1
        return Silent()

    blackhole = await asyncio.get_running_loop().create_server(accept, "127.0.0.1", dead.port)
    try:
        await verdict_in(dead)
        assert "Client.Timeout exceeded" in (checker.unreachable(NAME) or "")
        caplog.set_level(logging.DEBUG)
        checks, seen = checker.checks, connections
        await until(lambda: checker.checks >= checks + 3, what="three retries")
        made = checker.checks - checks
        # one connection per retry (not five), and none from discovery or OpenAPI
        assert connections - seen in (made, made + 1)  # + the retry in flight
        assert [r for r in caplog.records if r.name.startswith(WATCHED)] == []
    finally:
        blackhole.close()


async def test_when_the_backend_is_back_discovery_and_openapi_fetch_it_at_once(
    start_dead: StartDead, start_backend: StartBackend
) -> None:
    dead = await start_dead()
    checker, gateway = dead.gateway.control.availability, dead.gateway
    # OpenAPI's own schedule would wait a minute and more: only the checker's word explains a fetch
    gateway.control.openapi.refresher.interval = gateway.control.openapi.refresher.backoff_initial = 60.0
    gateway.control.openapi.refresher.backoff_max = 60.0
    gateway.control.discovery.fetcher.refresh_interval = gateway.control.discovery.fetcher.backoff_initial = 60.0
    gateway.control.discovery.fetcher.backoff_max = 60.0
    await verdict_in(dead)
    backend = await start_backend(hosts=[f"dead.{NAMESPACE}.svc"])
    await backend.stop()
    backend.port = dead.port  # the same backend comes back on its address

    async def resource_list(_request: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "dead.example.com/v1", "resources": []}
        )

    backend.routes[PREFIX] = resource_list
    await backend.start()
    try:
        await until(lambda: checker.is_available(NAME), what="the checker to find it back")
        assert checker.unreachable(NAME) is None
        await until(lambda: gateway.control.discovery.fetcher.states[NAME].failures == 0, what="discovery fetched")
        await until(lambda: any(r.raw_path == "/openapi/v2" for r in backend.received), what="OpenAPI downloaded")
    finally:
        await backend.stop()
