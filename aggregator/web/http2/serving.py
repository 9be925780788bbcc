"""What every HTTP/2 connection of one listener shares: the pipeline's entry, the limits, the
libnghttp2 binding, the header-name and field caches, and the live connections, for the server's
graceful shutdown (`shut_down`: GOAWAY on each) and its close, and where a flood's cut
penalises its address (`penalty.py`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aggregator.web.http2.heads import HeaderNames, ResponseHeads
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.metrics import ConnectionMetrics
from aggregator.web.http2.nghttp2 import Nghttp2
from aggregator.web.serverrequest import ServerRequest

# The pipeline's entry (`Pipeline.handle`).
Handler = Callable[[ServerRequest], Awaitable[Any]]


class LiveConnection(Protocol):
    def shut_down(self, reason: str = ...) -> None: ...

    def close(self) -> None: ...


class Penalising(Protocol):
    """Where a connection cut for a flood reports its client's address (`penalty.Penalties`)."""

    def penalise(self, address: str | None) -> None: ...


class _NoPenalty:
    def penalise(self, address: str | None) -> None:
        pass


class Http2Serving:
    def __init__(
        self,
        handler: Handler,
        limits: H2Limits,
        metrics: ConnectionMetrics,
        nghttp2: Nghttp2,
        penalties: Penalising | None = None,
    ) -> None:
        self.handler = handler
        self.penalties: Penalising = penalties or _NoPenalty()
        self.limits = limits
        self.metrics = metrics
        self.nghttp2 = nghttp2
        self.names = HeaderNames()
        self.heads = ResponseHeads(nghttp2.ffi)
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
