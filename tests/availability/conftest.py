"""Fixtures: fake extension servers over real TLS, and the objects that register them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.availability.support import Harness
from tests.proxy.support import SERVER_NAME, BackendPKI, FakeBackend, make_backend_pki
from tests.support.gateway import local_options
from tests.support.pki import PKI


@pytest.fixture(scope="session")
def backend_pki(tmp_path_factory: pytest.TempPathFactory) -> BackendPKI:
    return make_backend_pki(tmp_path_factory.mktemp("availability-backend-pki"))


StartBackend = Callable[..., Awaitable[FakeBackend]]


@pytest.fixture
async def start_backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[StartBackend]:
    """`await start_backend(hosts=[...], ca=..., client_ca=...)`: a TLS extension server on 127.0.0.1."""
    async with AsyncExitStack() as stack:
        count = 0

        async def start(
            *, hosts: list[str] | None = None, ca: object = None, client_ca: str | None = None
        ) -> FakeBackend:
            nonlocal count
            count += 1
            cert, key = backend_pki.serving(f"backend-{count}", hosts or [SERVER_NAME], ca=ca)  # type: ignore[arg-type]
            fake = FakeBackend(cert, key, client_ca or pki.path("front-proxy-ca.crt"))
            await fake.start()
            stack.push_async_callback(fake.stop)
            return fake

        yield start


@pytest.fixture
async def harness(pki: PKI, tmp_path: Path) -> AsyncIterator[Harness]:
    """A store, the proxy transport over it, and the probe: the checker's parts without a gateway."""
    folder = tmp_path / "objects"
    folder.mkdir()
    h = Harness(local_options(pki, str(folder)))
    yield h
    await h.close()
