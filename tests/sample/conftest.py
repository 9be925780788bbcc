"""A running sample server over real TLS, and a client that calls it the way a front proxy does."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from sample_apiserver import SampleOptions, SampleServer

from tests.support.pki import PKI

ADMIN = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}


def sample_options(pki: PKI, **overrides: Any) -> SampleOptions:
    base = SampleOptions(
        bind_address="127.0.0.1",
        secure_port=0,
        tls_cert_file=pki.path("serving.crt"),
        tls_private_key_file=pki.path("serving.key"),
        requestheader_client_ca_file=pki.path("front-proxy-ca.crt"),
        requestheader_allowed_names=["front-proxy-client"],
    )
    return replace(base, **overrides)


class Client:
    """Requests to the sample server with a chosen client certificate and identity headers."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, ssl_context: ssl.SSLContext, headers: dict[str, str]
    ):
        self.session = session
        self.url = url
        self.ssl = ssl_context
        self.headers = headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any, bytes]:
        """(status, headers, parsed JSON or None, raw body)."""
        all_headers = {**self.headers, **(headers or {})}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            all_headers["Content-Type"] = content_type
        async with self.session.request(
            method, self.url + path, data=data, headers=all_headers, params=params, ssl=self.ssl
        ) as response:
            raw = await response.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            return response.status, dict(response.headers), parsed, raw

    async def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], Any, bytes]:
        return await self.request("GET", path, **kw)


MakeClient = Callable[..., Client]


@pytest.fixture
async def sample(pki: PKI) -> AsyncIterator[SampleServer]:
    server = SampleServer(sample_options(pki, watch_bookmark_interval=0.2))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def start_sample(pki: PKI) -> AsyncIterator[Callable[..., Any]]:
    async with AsyncExitStack() as stack:

        async def start(**overrides: Any) -> SampleServer:
            server = SampleServer(sample_options(pki, **overrides))
            await server.start()
            stack.push_async_callback(server.stop)
            return server

        yield start


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def make_client(pki: PKI, session: aiohttp.ClientSession) -> MakeClient:
    def make(
        server: SampleServer, cert: str | None = "front-proxy-client", headers: dict[str, str] | None = None
    ) -> Client:
        return Client(session, server.url, pki.client_context(cert), ADMIN if headers is None else headers)

    return make


@pytest.fixture
def admin(sample: SampleServer, make_client: MakeClient) -> Client:
    return make_client(sample)
