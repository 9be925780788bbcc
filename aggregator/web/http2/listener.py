"""One listener, two protocols: the ALPN dispatch, and what the HTTP/2 connections share.

The TLS context offers `h2` and `http/1.1` (kube-apiserver's `NextProtos`; only `http/1.1` with
`--disable-http2-serving`). Once the handshake is done, `AlpnDispatch` reads what was negotiated
and hands the transport to the protocol that speaks it: an `H2ServerConnection`, or aiohttp's
HTTP/1.1 handler, which then runs exactly as if it had been the listener's only protocol. A client
that offers no ALPN at all gets HTTP/1.1, as from Go's server.

What every HTTP/2 connection of the listener shares is `serving.Http2Serving`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aggregator.web.alpn import H2, HTTP11
from aggregator.web.http2.connection import H2ServerConnection
from aggregator.web.http2.metrics import ConnectionMetrics
from aggregator.web.http2.serving import Http2Serving


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
