"""Benchmark: what one HTTP/2 exchange costs in the codec alone, for each implementation looked at.

Run from the repository root:  .venv/bin/python benchmarks/http2_codec.py [--requests 5000]

No sockets, no TLS, no pipeline: a client's bytes for N kubectl-like GETs (9 headers, the HPACK
table warm after the first) are fed to a server, which answers each with the same 6 headers and an
820-byte body; the CPU time per exchange is printed for:

- `h2`: the pure-Python library as the gateway configured it before (inbound validation on);
- `h2 tuned`: the same with every per-event validation and normalization switched off (what a
  gateway doing its own checks once per request could use);
- `nghttp2`: libnghttp2 through the gateway's cffi binding, the session driven directly;
- `gateway`: the gateway's own HTTP/2 layer (`web/http2/connection.py`) on that binding, with a
  handler that answers a fixed `Response`: what serving adds around the codec (streams, heads,
  handler tasks), still without TLS or the pipeline.

The figures choose the implementation (docs/architecture.md): the ratios carry over, the absolute
numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import h2.config
import h2.connection
import h2.events
import h2.settings
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from aggregator.web.http2 import nghttp2
from aggregator.web.http2.connection import H2ServerConnection
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.metrics import ConnectionMetrics
from aggregator.web.http2.serving import Http2Serving
from aggregator.web.serverrequest import Response, ServerRequest

BODY = b'{"kind":"Flunder","apiVersion":"wardle.example.com/v1beta1","metadata":{"name":"f"}' + b" " * 736 + b"}"
REQUEST = [
    (b":method", b"GET"),
    (b":scheme", b"https"),
    (b":authority", b"127.0.0.1:8443"),
    (b":path", b"/apis/wardle.example.com/v1beta1/namespaces/default/flunders/bench-flunder"),
    (b"accept", b"application/json, */*"),
    (b"user-agent", b"kubectl/v1.32.0 (linux/amd64) kubernetes/70d3cc9"),
    (b"kubectl-command", b"kubectl get"),
    (b"kubectl-session", b"6f0b3e8e-9f7a-4d8a-9f62-1c1f2c3e4d5a"),
    (b"accept-encoding", b"gzip"),
]
ANSWER = [
    (b":status", b"200"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
    (b"audit-id", b"0b3c1a52-3a3d-4b7e-9f3e-1a2b3c4d5e6f"),
    (b"cache-control", b"no-cache, private"),
    (b"date", b"Sat, 28 Nov 2026 01:35:16 GMT"),
]


def client_bytes(count: int) -> tuple[bytes, list[bytes]]:
    """The preface (with windows wide open, so the server never waits for them) and each request."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**31 - 1 - 65535)
    preface = client.data_to_send()
    requests = []
    for _ in range(count):
        client.send_headers(client.get_next_available_stream_id(), REQUEST, end_stream=True)
        requests.append(client.data_to_send())
    return preface, requests


def with_h2(preface: bytes, requests: list[bytes], *, tuned: bool) -> float:
    settings: dict[str, Any] = {
        "client_side": False,
        "header_encoding": None,
        "validate_outbound_headers": False,
        "normalize_outbound_headers": False,
    }
    if tuned:
        settings.update(validate_inbound_headers=False, normalize_inbound_headers=False)
    server = h2.connection.H2Connection(h2.config.H2Configuration(**settings))
    server.initiate_connection()
    server.receive_data(preface)
    server.data_to_send()
    started = time.process_time()
    for data in requests:
        for event in server.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                server.send_headers(event.stream_id, ANSWER)
                server.send_data(event.stream_id, BODY, end_stream=True)
        server.data_to_send()
    return time.process_time() - started


class RawSession:
    """The binding's session driven directly: every request answered from its callbacks."""

    def __init__(self, binding: nghttp2.Nghttp2) -> None:
        self.binding = binding
        session = binding.new_session(H2Limits(), self)
        self.session, self._session, self.data_provider = session.handle, session, session.data_provider
        self.queued: dict[int, bytes] = {}
        answer = CIMultiDict((name.decode(), value.decode()) for name, value in ANSWER[1:])
        # The serving's buffer holds the packed head: kept alive as long as the session uses it.
        self.serving = Http2Serving(_never, H2Limits(), _metrics(), binding)
        self.array, self.count, self._data, _close = self.serving.heads.pack(200, answer, len(BODY))

    def on_header(
        self, session: Any, hd: Any, name: Any, namelen: int, value: Any, valuelen: int, flags: int, user_data: Any
    ) -> int:
        return 0

    def on_frame_recv(self, session: Any, hd: Any, user_data: Any) -> int:
        if hd.type == nghttp2.HEADERS and hd.flags & nghttp2.FLAG_END_STREAM:
            self.queued[hd.stream_id] = BODY
            lib = self.binding.lib
            lib.nghttp2_submit_response(self.session, hd.stream_id, self.array, self.count, self.data_provider)
        return 0

    def on_invalid_frame(self, session: Any, hd: Any, error: int, user_data: Any) -> int:
        return 0

    def on_data(self, session: Any, flags: int, stream_id: int, data: Any, length: int, user_data: Any) -> int:
        return 0

    def on_stream_close(self, session: Any, stream_id: int, error_code: int, user_data: Any) -> int:
        return 0

    def read_body(
        self, session: Any, stream_id: int, buf: Any, length: int, flags: Any, source: Any, user_data: Any
    ) -> int:
        body = self.queued.pop(stream_id)
        self.binding.ffi.memmove(buf, body, len(body))
        flags[0] = nghttp2.DATA_FLAG_EOF
        return len(body)

    def on_error(self, session: Any, code: int, message: Any, length: int, user_data: Any) -> int:
        return 0

    def feed(self, data: bytes) -> None:
        binding, lib = self.binding, self.binding.lib
        lib.nghttp2_session_mem_recv(self.session, data, len(data))
        while lib.nghttp2_session_mem_send(self.session, binding.out) > 0:
            pass


def with_nghttp2(binding: nghttp2.Nghttp2, preface: bytes, requests: list[bytes]) -> float:
    session = RawSession(binding)
    session.feed(preface)
    started = time.process_time()
    for data in requests:
        session.feed(data)
    return time.process_time() - started


async def _never(_request: ServerRequest) -> None:
    raise AssertionError("not called")


def _metrics() -> ConnectionMetrics:
    return ConnectionMetrics(CollectorRegistry())


class Sink:
    """A transport that keeps nothing."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


async def with_gateway(binding: nghttp2.Nghttp2, preface: bytes, requests: list[bytes]) -> float:
    answer = Response(200, BODY, {"Content-Type": "application/json", "Audit-Id": "0b3c1a52"})

    async def handler(request: ServerRequest) -> None:
        await request.respond(answer)

    serving = Http2Serving(handler, H2Limits(), _metrics(), binding)
    connection = H2ServerConnection(serving)
    transport = Sink()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(preface)
    await asyncio.sleep(0)
    started = time.process_time()
    for data in requests:
        connection.data_received(data)
        await asyncio.sleep(0)  # the handler's turn
        await asyncio.sleep(0)  # the flush's
    elapsed = time.process_time() - started
    connection.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    binding, why = nghttp2.load()
    if binding is None:
        sys.exit(f"http2_codec: {why}")
    preface, requests = client_bytes(args.requests)
    rows = [
        ("h2", with_h2(preface, requests, tuned=False)),
        ("h2 tuned", with_h2(preface, requests, tuned=True)),
        ("nghttp2", with_nghttp2(binding, preface, requests)),
        ("gateway", asyncio.run(with_gateway(binding, preface, requests))),
    ]
    base = rows[0][1]
    print(f"{args.requests} exchanges, {why}; CPU per exchange and its ratio to h2's:")
    for label, seconds in rows:
        print(f"  {label:9s} {seconds / args.requests * 1e6:7.1f} us   {seconds / base:5.2f}x")


if __name__ == "__main__":
    main()
