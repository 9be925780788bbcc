"""The benchmarks' GET as the pipeline sees it, without a socket: a `RequestContext` for the instruction
counts of one piece of the request path (`tracing_instructions.py`, `apf_instructions.py`)."""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.web.connection import Connection
from aggregator.web.context import RequestContext
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import EncodedHeaders

PATH = "/apis/bench.example.com/v1/namespaces/default/things/thing-1"
# What the benchmark's client sends (proxy.py: wrk behind nginx), no traceparent.
HEADERS = {"Host": "127.0.0.1", "User-Agent": "wrk", "Accept": "*/*", "Connection": "keep-alive"}


class Head:
    """The head of the benchmark's GET: what `RequestContext` reads of a `ServerRequest` (no
    handler runs, so nothing is answered)."""

    def __init__(self) -> None:
        self.method = "GET"
        self.target = self.raw_path = PATH
        self.raw_query = ""
        self.headers = CIMultiDictProxy(CIMultiDict(HEADERS))
        self.connection = Connection("127.0.0.1", None)
        self.on_head: Any = None
        self.head_lines: bytes | None = None

    def add_encoded_headers(self, _headers: CIMultiDict[str], encoded: EncodedHeaders) -> None:
        """As HTTP/1.1's request does (`Http1Request`): the lines go to the writer, one answer's here."""
        self.head_lines = encoded.lines


async def _handler(_ctx: RequestContext) -> Any:
    return None


ROUTE = Route(_handler, RouteKind.BACKEND, "bench")


def context() -> RequestContext:
    return RequestContext(Head(), lambda _path: ROUTE, 0.0)  # type: ignore[arg-type]  # only its head is read
