"""A gateway whose reviews go to the fake kube-apiserver, and a client that calls it as test users."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from aggregator.runners.server import GatewayServer
from aggregator.web.context import RequestContext
from aggregator.web.responses import json_response
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import Response
from tests.conftest import StartGateway
from tests.support.contexts import user_of
from tests.support.fakekube import FakeKube
from tests.support.fakereviews import FakeReviews
from tests.support.pki import PKI

# An API group the test routes answer for (as an OWN route: the gateway authorizes it like any other).
GROUP_PREFIX = "/apis/wardle.example.com/"


async def echo_user(ctx: RequestContext) -> Response:
    user = user_of(ctx)
    return json_response(ctx, {"name": user.name, "groups": list(user.groups)})


@dataclass
class Caller:
    """Calls a running gateway as a test user (client certificate stem), sharing connections."""

    server: GatewayServer
    pki: PKI
    session: aiohttp.ClientSession
    _contexts: dict[str | None, ssl.SSLContext] = field(default_factory=dict)

    def context(self, cert: str | None) -> ssl.SSLContext:
        if cert not in self._contexts:
            self._contexts[cert] = self.pki.client_context(cert)
        return self._contexts[cert]

    async def __call__(
        self,
        path: str,
        *,
        cert: str | None = "alice",
        method: str = "GET",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        async with self.session.request(
            method, self.server.url + path, ssl=self.context(cert), headers=headers or {}
        ) as resp:
            return resp.status, await resp.read()


@dataclass
class Reviewed:
    server: GatewayServer
    fake: FakeKube
    reviews: FakeReviews
    call: Caller

    def metric(self, name: str, **labels: str) -> float:
        value = self.server.gateway.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


StartReviewed = Callable[..., Awaitable[Reviewed]]


def add_test_routes(server: GatewayServer) -> None:
    router = server.gateway.router
    router.add_exact("/whoami", Route(echo_user, RouteKind.OWN, "whoami"))
    router.add_prefix(GROUP_PREFIX, Route(echo_user, RouteKind.OWN, "wardle"))
    router.add_exact("/delegated", Route(echo_user, RouteKind.DELEGATE, "delegate"))


@pytest.fixture
def users(pki: PKI) -> PKI:
    pki.issue_user("alice", "alice", ("devs",))
    pki.issue_user("bob", "bob")
    return pki


@pytest.fixture
async def start_reviewed(
    start_gateway: StartGateway, fake_kube: FakeKube, users: PKI
) -> AsyncIterator[StartReviewed]:
    """`await start_reviewed(**options)`: a local gateway reviewing through the fake kube-apiserver."""
    reviews = FakeReviews(fake_kube)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as session:

        async def start(**overrides: Any) -> Reviewed:
            server = await start_gateway(kubeconfig=str(fake_kube.kubeconfig), **overrides)
            add_test_routes(server)
            return Reviewed(server, fake_kube, reviews, Caller(server, users, session))

        yield start
