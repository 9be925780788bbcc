"""Start a real gateway in-process: real TLS on a real socket, torn down after the test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aggregator.assembly import Gateway
from aggregator.config import Config, Options, complete, validate
from aggregator.runners.server import GatewayServer
from tests.support.options import flag_options, with_flags
from tests.support.pki import PKI


def local_options(pki: PKI, apiservices_dir: str, **overrides: object) -> Options:
    """Local mode on a free port with the test PKI's serving pair and client CAs; `overrides` are
    flags by name (`tests/support/options.py`)."""
    base = flag_options(
        bind_address="127.0.0.1",
        secure_port=0,
        tls_cert_file=pki.path("serving.crt"),
        tls_private_key_file=pki.path("serving.key"),
        client_ca_file=pki.path("client-ca.crt"),
        requestheader_client_ca_file=pki.path("front-proxy-ca.crt"),
        requestheader_allowed_names=["front-proxy-client"],
        proxy_client_cert_file=pki.path("front-proxy-client.crt"),
        proxy_client_key_file=pki.path("front-proxy-client.key"),
        apiservices_dir=apiservices_dir,
    )
    options = with_flags(base, **overrides)
    validate(options)
    return options


@contextlib.asynccontextmanager
async def running_gateway(
    options: Options | Config, gateway: Gateway | None = None
) -> AsyncIterator[GatewayServer]:
    """`options` are completed here (`config.complete`), as `aggregator serve` does."""
    config = complete(options) if isinstance(options, Options) else options
    server = GatewayServer(config, gateway)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
