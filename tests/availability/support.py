"""Build the objects a check reads, and run checks without a whole gateway."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from prometheus_client import CollectorRegistry

from aggregator.assembly import build_backends, flag_identity_policy
from aggregator.availability.metrics import AvailabilityMetrics
from aggregator.availability.probe import AccessError, DiscoveryProbe, Report, check_apiservice
from aggregator.backends.metrics import BackendMetrics
from aggregator.config import Options, complete
from aggregator.model.apiservice import decode_apiservice
from aggregator.model.objects import decode_endpointslice, decode_service
from aggregator.sources.store import Store
from aggregator.tls.issue import KeyPair
from tests.support.backend import (
    APISERVICE,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.pki import PKI
from tests.support.threaded import ThreadedTLSServer

StartBackend = Callable[..., Awaitable[FakeBackend]]


@contextlib.asynccontextmanager
async def backends(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[StartBackend]:
    """`await start(hosts=[...], ca=..., client_ca=...)`: TLS extension servers on 127.0.0.1,
    demanding a front-proxy client certificate; all stopped on exit."""
    async with AsyncExitStack() as stack:
        count = 0

        async def start(
            *, hosts: list[str] | None = None, ca: KeyPair | None = None, client_ca: str | None = None
        ) -> FakeBackend:
            nonlocal count
            count += 1
            cert, key = backend_pki.serving(f"backend-{id(stack)}-{count}", hosts or [SERVER_NAME], ca=ca)
            fake = FakeBackend(cert, key, client_ca or pki.path("front-proxy-ca.crt"))
            await fake.start()
            stack.push_async_callback(fake.stop)
            return fake

        yield start


class Harness:
    """A store, the backend registry over it, and a `DiscoveryProbe`."""

    def __init__(self, options: Options, *, timeout: float = 2.0) -> None:
        self.options = options
        self.store = Store()
        registry = CollectorRegistry()
        self.metrics = AvailabilityMetrics(registry)  # for the checkers the tests build
        identity = flag_identity_policy(options.authentication.requestheader)
        self.backends = build_backends(
            complete(options).backends, self.store, BackendMetrics(registry), identity=identity
        )
        self.probe = DiscoveryProbe(self.backends, timeout=timeout)

    def add(self, *manifests: dict[str, Any]) -> None:
        for doc in manifests:
            kind = doc["kind"]
            if kind == "APIService":
                self.store.upsert(decode_apiservice(doc))
            elif kind == "Service":
                self.store.upsert(decode_service(doc))
            else:
                self.store.upsert(decode_endpointslice(doc))

    def register(
        self,
        port: int,
        *,
        ca_pem: bytes | None,
        service_port: int | None = None,
        cluster_ip: str = "127.0.0.1",
        slice_port_name: str = "https",
        ready: bool | None = True,
        **apiservice: Any,
    ) -> None:
        """An APIService for the demo group, its Service at `cluster_ip:port`, one EndpointSlice."""
        self.add(
            apiservice_manifest(port=port, ca_pem=ca_pem, available=False, **apiservice),
            service_manifest(port=service_port or port, cluster_ip=cluster_ip),
            endpointslice_manifest("api-1", [("127.0.0.1", ready)], port=port, port_name=slice_port_name),
        )

    async def check(
        self, name: str = APISERVICE, *, access: AccessError | None = None, inspect_tls: bool = False
    ) -> Report:
        svc = self.store.apiservice(name)
        assert svc is not None, name
        return await check_apiservice(svc, self.store, self.probe, access=access, inspect_tls=inspect_tls)

    async def close(self) -> None:
        await self.backends.stop()


class AlertingBackend(ThreadedTLSServer):
    """A TLS server that refuses client certificates the way Go servers do: with an alert.

    asyncio's TLS servers close the connection without sending the alert OpenSSL produced, so
    this one runs blocking sockets on a thread, where OpenSSL writes the alert before closing.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca_file)
        self.refused = 0
        super().__init__(context, name="alerting-backend", timeout=2.0)

    def handle(self, conn: socket.socket) -> None:
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except ssl.SSLError:
            self.refused += 1
