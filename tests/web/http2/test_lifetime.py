"""A lost HTTP/2 connection does not keep itself alive through its libnghttp2 callbacks.

Each session's callbacks are its connection's bound methods: a reference cycle while the
connection lives, broken when it is lost, so the HTTP/2 layer leaves no cycle of its own for the
cyclic collector (which `gc.freeze`, `util/runtime.settle_heap_later`, may have put out of reach).
Driven below the pipeline (a handler that answers, a transport that keeps nothing): the pipeline's
request context holds a stream until the collector runs, whatever the protocol.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import h2.config
import h2.connection
import pytest
from prometheus_client import CollectorRegistry

from aggregator.web.http2 import nghttp2
from aggregator.web.http2.connection import H2ServerConnection
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.metrics import ConnectionMetrics
from aggregator.web.http2.serving import Http2Serving
from aggregator.web.serverrequest import Response, ServerRequest
from tests.support.polling import until

binding, _why = nghttp2.load()
pytestmark = pytest.mark.skipif(binding is None, reason="libnghttp2 is not installed")


class Sink:
    """A transport that keeps nothing."""

    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def test_a_lost_connection_is_freed_without_the_cyclic_collector(no_cyclic_collector: None) -> None:
    assert binding is not None

    async def handler(request: ServerRequest) -> None:
        await request.respond(Response(200, b"ok", {"Content-Type": "text/plain"}))

    serving = Http2Serving(handler, H2Limits(), ConnectionMetrics(CollectorRegistry()), binding)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    request = [(":method", "GET"), (":path", "/x"), (":scheme", "https"), (":authority", "a")]
    client.send_headers(1, request, end_stream=True)
    connection = H2ServerConnection(serving)
    transport = Sink()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(client.data_to_send())
    await until(lambda: b"ok" in transport.written, what="the answer to be written")
    connection.connection_lost(None)
    freed = weakref.ref(connection)
    del connection
    assert freed() is None
