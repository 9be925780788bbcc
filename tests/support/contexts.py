"""Request contexts for unit tests: what the pipeline builds for a request, without a server.

`RecordedRequest` is a `ServerRequest` held in memory: a handler answers it exactly as it answers
one from HTTP/1.1 or HTTP/2, and the test reads what was answered (`answers`, `body_written`).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.model.userinfo import UserInfo
from aggregator.web.connection import HTTP1, Connection
from aggregator.web.context import RequestContext
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import (
    EncodedHeaders,
    HeadHook,
    RequestBody,
    Response,
    StreamedResponse,
    Tunnel,
)


async def _unused(_ctx: RequestContext) -> Response:
    raise AssertionError("the test route's handler is never called")


TEST_ROUTE = Route(_unused, RouteKind.OWN, "test")


class BytesBody:
    """A request body that is all there at once."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def readany(self) -> bytes:
        data, self._data = self._data, b""
        return data

    async def read(self, n: int = -1) -> bytes:
        if n < 0:
            return await self.readany()
        data, self._data = self._data[:n], self._data[n:]
        return data

    def at_eof(self) -> bool:
        return not self._data


class RecordedAnswer:
    """A streamed answer kept in memory."""

    def __init__(self, status: int, headers: CIMultiDict[str]) -> None:
        self.status = status
        self.headers = headers
        self.chunks: list[bytes] = []
        self.finished = False
        self.aborted = False

    @property
    def body_length(self) -> int:
        return sum(len(c) for c in self.chunks)

    async def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    async def finish(self, chunk: bytes = b"") -> None:
        if chunk:
            self.chunks.append(chunk)
        self.finished = True

    def abort(self) -> None:
        self.aborted = True

    @property
    def chunked(self) -> bool:
        return True


class RecordedRequest:
    """A `ServerRequest` in memory (see the module docstring)."""

    def __init__(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str] | None = None,
        *,
        body: bytes | None = None,
        remote: str | None = "127.0.0.1",
        ssl_object: ssl.SSLObject | None = None,
        protocol: str = HTTP1,
    ) -> None:
        self.method = method
        self.target = target
        self.raw_path, _, self.raw_query = target.partition("#")[0].partition("?")
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(headers or {}))
        self.connection = Connection(remote, ssl_object, protocol)
        self._body: RequestBody | None = BytesBody(body) if body is not None else None
        self.on_head: HeadHook | None = None
        self.streamed: StreamedResponse | None = None
        self.answers: list[Response | RecordedAnswer] = []
        self.aborted = False
        self.closed: str | None = None

    @property
    def body(self) -> RequestBody | None:
        return self._body

    async def respond(self, response: Response) -> None:
        if self.on_head is not None:
            self.on_head(response.status, response.headers)
        self.answers.append(response)

    async def stream(
        self, status: int, headers: CIMultiDict[str], *, reason: str = "", head_now: bool = True
    ) -> StreamedResponse:
        if self.on_head is not None:
            self.on_head(status, headers)
        answer = RecordedAnswer(status, headers)
        self.answers.append(answer)
        self.streamed = answer
        return answer

    def tunnel(self) -> Tunnel | None:
        return None

    def add_encoded_headers(self, headers: CIMultiDict[str], encoded: EncodedHeaders) -> None:
        headers.extend(encoded.pairs)

    def abort(self) -> None:
        self.aborted = True

    def close_connection(self, reason: str = "connection_close") -> None:
        self.closed = reason

    @property
    def body_written(self) -> bytes:
        """The body of the last answer."""
        answer = self.answers[-1]
        return answer.body if isinstance(answer, Response) else b"".join(answer.chunks)


def context_for(
    method: str,
    target: str,
    *,
    headers: Mapping[str, str] | None = None,
    route: Route = TEST_ROUTE,
    user: UserInfo | None = None,
    body: bytes | None = None,
    ssl_object: ssl.SSLObject | None = None,
    remote: str | None = "127.0.0.1",
) -> RequestContext:
    """The context the pipeline would build for this request (a `RecordedRequest`)."""
    request = RecordedRequest(method, target, headers, body=body, ssl_object=ssl_object, remote=remote)
    ctx = RequestContext(request, lambda _path: route, time.monotonic())
    ctx.user = user
    return ctx


def recorded(ctx: RequestContext) -> RecordedRequest:
    """The in-memory request behind a test context."""
    request = ctx.request
    assert isinstance(request, RecordedRequest)
    return request


def user_of(ctx: RequestContext) -> UserInfo:
    """The user the gates settled on (for test handlers behind a real pipeline)."""
    assert ctx.user is not None
    return ctx.user
