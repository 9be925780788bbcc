"""The one interface between the protocols and everything above them.

A protocol module (`web/http1/`, `web/http2/`) parses a request head, then hands the pipeline a
`ServerRequest`: the head (method, target, path and query as sent, headers), the connection it
came on, the body as a byte stream, and two ways to answer: `respond` with a whole `Response`
(the gateway's own answers: Status errors, discovery, OpenAPI, health), or `stream` for an
answer whose body arrives over time (a proxied answer, a watch), which returns the
`StreamedResponse` the handler writes to. Nothing above this module knows which protocol carried
the request: a handler gets the request's `RequestContext` (`context.py`), whose `request` is
this, and returns what it answered (httpcore's `http11.py`/`http2.py` behind one interface,
mitmproxy's protocol layers).

What only one protocol can do is optional: `tunnel()` gives the raw connection for a protocol
upgrade (exec, attach, port-forward), which only HTTP/1.1 has (RFC 9113 forbids `Upgrade`).

Every answer's head goes through `on_head` before it is written (the request's context sets it:
the audit adds its `Audit-Id` header and records ResponseStarted, the context notes the status).
A listener may add constant headers encoded once (`EncodedHeaders`, `add_encoded_headers`): HTTP/1.1
writes their bytes as they are instead of checking and encoding them again for every answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.web.connection import Connection

# Told of an answer's head just before it is written: its status and (mutable) headers.
HeadHook = Callable[[int, CIMultiDict[str]], None]


class RequestBody(Protocol):
    """A request body as it arrives: read a chunk at a time, with backpressure to the client."""

    async def readany(self) -> bytes:
        """The next bytes (b"" at the end)."""
        ...

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes, or all that is left when `n` is -1."""
        ...

    def at_eof(self) -> bool: ...


class Response:
    """A whole answer the gateway writes itself: status, headers and body, sent in one go.

    `status_object` keeps the Kubernetes Status the body carries, for the audit's
    `responseStatus` (upstream records the Status its handlers write, not its bytes). `close`
    ends the connection after it (HTTP/1.1 `Connection: close`; HTTP/2 GOAWAY).
    """

    __slots__ = ("body", "close", "headers", "reason", "status", "status_object")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: CIMultiDict[str] | dict[str, str] | None = None,
        *,
        content_type: str | None = None,
        reason: str = "",
    ) -> None:
        self.status = status
        self.body = body
        self.headers: CIMultiDict[str] = headers if isinstance(headers, CIMultiDict) else CIMultiDict(headers or ())
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        self.reason = reason
        self.close = False
        self.status_object: dict[str, Any] | None = None

    @property
    def body_length(self) -> int:
        return len(self.body)

    def force_close(self) -> None:
        self.close = True

    def __repr__(self) -> str:
        return f"<Response {self.status} {len(self.body)} bytes>"


class EncodedHeaders:
    """Constant headers, checked and encoded for HTTP/1.1 once (`ServerRequest.add_encoded_headers`).

    `lines` is what aiohttp's writer would make of them (`name: value\r\n`, UTF-8), None when a
    name or value holds a character HTTP forbids in a field (RFC 9110 5.5: a control character but
    tab): such headers are added as any other, and the writer refuses them as it would have."""

    __slots__ = ("lines", "pairs")

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs
        safe = all(_field_safe(name) and _field_safe(value) for name, value in pairs)
        self.lines = b"".join(f"{name}: {value}\r\n".encode() for name, value in pairs) if safe else None


def _field_safe(text: str) -> bool:
    """Whether aiohttp's writer writes `text` in a head (`_write_str_raise_on_nlcr`)."""
    return not any((c < " " and c != "\t") or c == "\x7f" for c in text)


class StreamedResponse(Protocol):
    """An answer being written: its head is out (or goes out with the first bytes), its body
    follows chunk by chunk within the client's flow control."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> CIMultiDict[str]: ...

    @property
    def body_length(self) -> int:
        """Body bytes written so far (`apiserver_response_sizes`)."""
        ...

    async def write(self, chunk: bytes) -> None: ...

    async def finish(self, chunk: bytes = b"") -> None:
        """The last bytes, and the end of the answer."""
        ...

    def abort(self) -> None:
        """Cut the answer short so the client sees it truncated, never complete-looking (HTTP/1.1:
        the connection closes; HTTP/2: the stream is reset)."""
        ...

    @property
    def chunked(self) -> bool:
        """Whether the end of the body is marked in the stream itself (HTTP/1.1 chunks, HTTP/2
        END_STREAM) rather than by the connection's end."""
        ...


# What a handler returns: the answer it gave.
Answer = Response | StreamedResponse


class RawSink(Protocol):
    """What receives a connection's bytes once it is taken over for a tunnel."""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]: ...

    def feed_eof(self) -> None: ...


class Tunnel(StreamedResponse, Protocol):
    """An HTTP/1.1 connection taken over after a `101` (upgrades): the answer's body is whatever
    the backend sends, written raw; `abort` (or `finish`) closes the connection."""

    def take_over(self, sink: RawSink) -> None:
        """From now on every byte the client sends goes to `sink`, not to the HTTP parser."""
        ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    @property
    def closing(self) -> bool: ...


class ServerRequest(Protocol):
    """One request as a protocol hands it to the pipeline (see the module docstring)."""

    method: str
    # The request target as sent (path and query; absolute form kept), and its two parts as sent.
    target: str
    raw_path: str
    raw_query: str
    headers: CIMultiDictProxy[str]
    connection: Connection
    on_head: HeadHook | None

    @property
    def body(self) -> RequestBody | None:
        """The body as it arrives; None when the request has none."""
        ...

    # The answer `stream` started, if it did.
    streamed: StreamedResponse | None

    def respond(self, response: Response) -> Awaitable[None]:
        """Write `response` whole."""
        ...

    async def stream(
        self, status: int, headers: CIMultiDict[str], *, reason: str = "", head_now: bool = True
    ) -> StreamedResponse:
        """Start an answer whose body follows. `head_now` sends the head at once (a watch's
        client waits for it); otherwise it leaves with the first body bytes."""
        ...

    def tunnel(self) -> Tunnel | None:
        """The raw connection, for an upgrade; None where the protocol has none (HTTP/2)."""
        ...

    def abort(self) -> None:
        """Cut the answer short (`StreamedResponse.abort`), or refuse to give one: HTTP/1.1 closes
        the connection, HTTP/2 resets the stream."""
        ...

    def add_encoded_headers(self, headers: CIMultiDict[str], encoded: EncodedHeaders) -> None:
        """From a head listener (`on_head`): add `encoded` to the answer's head, after `headers`.
        HTTP/1.1 writes their lines as they are (they are then not in `headers`); HTTP/2 adds
        them to `headers`."""
        ...

    def close_connection(self, reason: str = "connection_close") -> None:
        """End the connection once this answer is out (the refusal of a caller that may not
        keep it: anonymous over HTTP/2, a shutdown); `reason` names why in metrics."""
        ...
