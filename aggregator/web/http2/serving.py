"""What every HTTP/2 connection of one listener shares: the pipeline's entry, the limits, the h2
configuration, the header-name cache, and the live connections, for the server's graceful
shutdown (`shut_down`: GOAWAY on each) and its close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from h2.config import H2Configuration

from aggregator.web.http2.heads import HeaderNames
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.metrics import ConnectionMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LiveConnection(Protocol):
    def shut_down(self, reason: str = ...) -> None: ...

    def close(self) -> None: ...


class Http2Serving:
    def __init__(
        self, handler: Handler, limits: H2Limits, metrics: ConnectionMetrics, *, client_max_size: int
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.metrics = metrics
        self.client_max_size = client_max_size
        # Inbound heads are validated by h2 (RFC 9113 8.2); outbound ones are built valid
        # (`heads.response_fields`) and not checked twice.
        self.config = H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.names = HeaderNames()
        self.connections: set[LiveConnection] = set()

    def opened(self, connection: LiveConnection) -> None:
        self.connections.add(connection)

    def closed(self, connection: LiveConnection) -> None:
        self.connections.discard(connection)

    def shut_down(self) -> None:
        """NotAcceptingNewRequest: GOAWAY on every connection; idle ones close, busy ones once
        their streams are done (Go's `Server.Shutdown` for HTTP/2)."""
        for connection in list(self.connections):
            connection.shut_down("shutdown")

    def close(self) -> None:
        for connection in list(self.connections):
            connection.close()
