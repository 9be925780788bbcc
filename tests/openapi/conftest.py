"""Fixtures: the extension-server PKI (shared with the proxy tests) and OpenAPI-publishing backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from tests.openapi.support import OpenAPIBackend, start_backend
from tests.support.backend import BackendPKI
from tests.support.fixtures import backend_pki  # noqa: F401 - re-exported fixture
from tests.support.pki import PKI

StartBackend = Callable[..., Any]


@pytest.fixture
async def start_openapi_backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[StartBackend]:  # noqa: F811
    """`await start_openapi_backend(namespace)`: a TLS backend serving `api.<namespace>.svc`."""
    async with AsyncExitStack() as stack:

        async def start(namespace: str) -> OpenAPIBackend:
            backend = await start_backend(backend_pki, pki, namespace)
            stack.push_async_callback(backend.backend.stop)
            return backend

        yield start
