"""Fixtures: fake extension servers over real TLS, and the checker's parts without a gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.availability.support import Harness, StartBackend, backends
from tests.support.backend import BackendPKI
from tests.support.gateway import local_options
from tests.support.pki import PKI

__all__ = ["StartBackend"]


@pytest.fixture
async def start_backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[StartBackend]:
    """`await start_backend(hosts=[...], ca=..., client_ca=...)`: a TLS extension server on 127.0.0.1."""
    async with backends(backend_pki, pki) as start:
        yield start


@pytest.fixture
async def harness(pki: PKI, tmp_path: Path) -> AsyncIterator[Harness]:
    """A store, the proxy transport over it, and the probe: the checker's parts without a gateway."""
    folder = tmp_path / "objects"
    folder.mkdir()
    h = Harness(local_options(pki, str(folder)))
    yield h
    await h.close()
