"""Fixtures shared by every test: a session PKI and an in-process gateway factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from aggregator.server import GatewayServer
from tests.support.fakekube import FakeKube, running_fake_kube
from tests.support.gateway import local_options, running_gateway
from tests.support.pki import PKI, make_pki

pytest_plugins = ("tests.support.fixtures",)


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
