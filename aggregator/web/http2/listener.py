"""One listener, two protocols: the ALPN dispatch, and what the HTTP/2 connections share.

The TLS context offers `h2` and `http/1.1` (kube-apiserver's `NextProtos`; only `http/1.1` with
`--disable-http2-serving`). Once the handshake is done, `AlpnDispatch` reads what was negotiated
and hands the transport to the protocol that speaks it: an `H2ServerConnection`, or aiohttp's
HTTP/1.1 handler, which then runs exactly as if it had been the listener's only protocol. A client
that offers no ALPN at all gets HTTP/1.1, as from Go's server.

`Http2Serving` holds what every HTTP/2 connection of the listener shares (the pipeline's entry,
the limits, the h2 configuration, the header-name cache) and the live connections, for the
server's graceful shutdown (`shut_down`: GOAWAY on each) and its close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from h2.config import H2Configuration

from aggregator.web.http2.connection import H2ServerConnection, Handler
from aggregator.web.http2.heads import HeaderNames
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.metrics import ConnectionMetrics

H2 = "h2"
HTTP11 = "http/1.1"


def alpn_protocols(http2: bool) -> tuple[str, ...]:
    """What the TLS context offers (secure_serving.go `tlsConfig`)."""
    return (H2, HTTP11) if http2 else (HTTP11,)


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
        self.connections: set[H2ServerConnection] = set()

    def opened(self, connection: H2ServerConnection) -> None:
        self.connections.add(connection)

    def closed(self, connection: H2ServerConnection) -> None:
        self.connections.discard(connection)

    def shut_down(self) -> None:
        """NotAcceptingNewRequest: GOAWAY on every connection; idle ones close, busy ones once
        their streams are done (Go's `Server.Shutdown` for HTTP/2)."""
        for connection in list(self.connections):
            connection.shut_down("shutdown")

    def close(self) -> None:
        for connection in list(self.connections):
            connection.close()


class AlpnDispatch(asyncio.Protocol):
    """Stands for the connection until TLS is up, then gives it to the negotiated protocol."""

    __slots__ = ("_http1", "_http2", "_metrics")

    def __init__(
        self,
        http1: Callable[[], asyncio.Protocol],
        http2: Http2Serving | None,
        metrics: ConnectionMetrics,
    ) -> None:
        self._http1 = http1
        self._http2 = http2
        self._metrics = metrics

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        negotiated = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        protocol: asyncio.Protocol
        if negotiated == H2 and self._http2 is not None:
            protocol = H2ServerConnection(self._http2)
            self._metrics.accepted(H2)
        else:
            protocol = self._http1()
            self._metrics.accepted(HTTP11)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


def dispatching(
    http1: Callable[[], asyncio.Protocol], http2: Http2Serving | None, metrics: ConnectionMetrics
) -> Callable[[], asyncio.Protocol]:
    """The listener's protocol factory."""
    return lambda: AlpnDispatch(http1, http2, metrics)
