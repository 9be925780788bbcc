"""Fixtures shared by every test: a session PKI and an in-process gateway factory; and the order
in which `make test`'s workers take the modules (the longest first)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from aggregator.runners.server import GatewayServer
from tests.support.fakekube import FakeKube, running_fake_kube
from tests.support.gateway import local_options, running_gateway
from tests.support.pki import PKI, make_pki

pytest_plugins = ("tests.support.fixtures",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked `long(seconds)` first, the longest first; the others keep pytest's order.

    `make test` hands whole modules to its workers in this order (`--dist loadfile`), so a
    module that takes a minute starts at once instead of being picked up last and running alone
    while the other workers sit idle. A module stays in one piece, so its module fixtures are
    made once. Every worker sorts the same items the same way, as xdist requires.
    """
    weight: dict[str, float] = {}
    for item in items:
        marker = item.get_closest_marker("long")
        seconds = 0.0 if marker is None else float(marker.args[0]) if marker.args else 1.0
        module = item.nodeid.split("::", 1)[0]
        weight[module] = max(weight.get(module, 0.0), seconds)
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def apiservices_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "apiservices"
    folder.mkdir()
    return folder


StartGateway = Callable[..., Awaitable[GatewayServer]]


@pytest.fixture
async def start_gateway(pki: PKI, apiservices_dir: Path) -> AsyncIterator[StartGateway]:
    """`await start_gateway(**option_overrides)` -> a running local-mode GatewayServer."""
    async with AsyncExitStack() as stack:

        async def start(**overrides: Any) -> GatewayServer:
            options = local_options(pki, str(apiservices_dir), **overrides)
            return await stack.enter_async_context(running_gateway(options))

        yield start


@pytest.fixture
async def fake_kube(tmp_path: Path) -> AsyncIterator[FakeKube]:
    """A running fake kube-apiserver over TLS; `fake_kube.kubeconfig` authenticates with a token."""
    async with running_fake_kube(tmp_path / "fake-kube") as fake:
        yield fake
