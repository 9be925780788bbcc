"""Proxy loops: an APIService whose backend is a gateway (itself, a replica, or another gateway
pointing back) is refused on purpose, with a 508 that names the loop and a `ProxyLoop` condition.

Each gateway here has a serving certificate valid for the APIService's Service name, so nothing but
the loop mark stops the loop (not a TLS failure, not authentication, not the probe's luck).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.backends.hops import HOP_HEADER
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import issue_serving_cert, write_pair
from tests.support.backend import (
    APISERVICE,
    PREFIX,
    SERVER_NAME,
    apiservice_manifest,
    backend_service,
    force_available,
    status_of,
    write_manifests,
)
from tests.support.fixtures import StartProxied
from tests.support.gateway import local_options, running_gateway
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port

THINGS = f"{PREFIX}/namespaces/default/things"

StartLoopable = Callable[..., Any]


@pytest.fixture
async def start_loopable(pki: PKI, tmp_path: Path) -> AsyncIterator[StartLoopable]:
    """`await start_loopable(port, backend_port)`: a local-mode gateway listening on `port`, whose
    serving certificate is valid for the demo APIService's Service, registered at `backend_port`."""
    write_pair(pki.dir, "loop-serving", issue_serving_cert(pki.ca, [SERVER_NAME, "127.0.0.1"]))
    async with AsyncExitStack() as stack:

        async def start(port: int, backend_port: int) -> GatewayServer:
            folder = tmp_path / f"objects-{port}"
            folder.mkdir()
            write_manifests(
                folder,
                "demo",
                apiservice_manifest(port=backend_port, ca_pem=pki.ca.cert_pem),
                *backend_service(backend_port),
            )
            options = local_options(
                pki,
                str(folder),
                secure_port=port,
                tls_cert_file=pki.path("loop-serving.crt"),
                tls_private_key_file=pki.path("loop-serving.key"),
            )
            return await stack.enter_async_context(running_gateway(options))

        yield start


async def get(server: GatewayServer, pki: PKI, path: str = THINGS) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + path, ssl=pki.client_context()) as resp,
    ):
        return resp.status, status_of(await resp.read())


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aggregator.proxy.loops"]


@pytest.mark.parametrize("topology", ["self", "each-other", "replicas"])
async def test_a_gateway_as_a_backend_is_a_proxy_loop(
    start_loopable: StartLoopable, pki: PKI, caplog: pytest.LogCaptureFixture, topology: str
) -> None:
    """self: the APIService's Service is this gateway. each-other: A's points at B and B's at A.
    replicas: two replicas behind one Service (here: both point at B, one of them itself)."""
    caplog.set_level(logging.WARNING, logger="aggregator.proxy.loops")
    port_a, port_b = free_port(), free_port()
    if topology == "self":
        gateways = [await start_loopable(port_a, port_a)]
    elif topology == "each-other":
        gateways = [await start_loopable(port_a, port_b), await start_loopable(port_b, port_a)]
    else:
        gateways = [await start_loopable(port_a, port_b), await start_loopable(port_b, port_b)]

    for server in gateways:
        checker = server.gateway.control.availability
        # awaited here: the lambda never outlives this iteration's checker
        await until(lambda: checker.reason(APISERVICE) == "ProxyLoop")  # noqa: B023
        verdict = checker.verdict(APISERVICE)
        assert verdict is not None and verdict.status == "False"
        assert "bad status from" in verdict.message and ": 508 [hop: http;" in verdict.message
        assert "the backend is an aggregator gateway: a proxy loop" in verdict.message
        # The condition makes the proxy answer at once, naming the loop.
        status, body = await get(server, pki)
        assert status == 508
        assert body["message"] == (
            f"proxy loop detected: the backend of APIService {APISERVICE} is an aggregator gateway"
        )

    # Proxied anyway (as while a stale condition still says Available): one extra hop, then 508.
    first = gateways[0]
    force_available(first)
    caplog.clear()
    status, body = await get(first, pki)
    assert status == 508 and body["reason"] == "LoopDetected"
    who = "this gateway" if topology == "self" else f"aggregator gateway {first.gateway.hop}"
    assert body["message"] == (
        f"proxy loop detected: this request was already forwarded by {who} ({HOP_HEADER}); an "
        "APIService must not be served by an aggregator gateway"
    )
    looped = [r for r in refusals(caplog) if fields_of(r)["path"] == THINGS]
    assert len(looped) == 1  # exactly one looped request, whichever gateway closed it
    assert fields_of(looped[0])["forwarded_by"] == first.gateway.hop


async def test_every_request_to_a_backend_carries_the_mark_and_a_callers_own_is_refused(
    start_proxied: StartProxied,
) -> None:
    proxied = await start_proxied()
    hop = proxied.server.gateway.hop
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 200
    (seen,) = proxied.backend.seen_by("admin")
    assert seen.all(HOP_HEADER) == [hop]
    # The gateway's own discovery, OpenAPI and probe requests too.
    own = proxied.backend.seen_by("system:kube-aggregator")
    assert own and all(r.all(HOP_HEADER) == [hop] for r in own)

    # A caller that sends the mark itself only refuses itself, before authentication.
    for cert in ("admin", None):
        async with proxied.request("GET", THINGS, cert=cert, headers={HOP_HEADER: "forged"}) as resp:
            assert resp.status == 508
            assert "already forwarded by aggregator gateway forged" in status_of(await resp.read())["message"]
    assert len(proxied.backend.seen_by("admin")) == 1
