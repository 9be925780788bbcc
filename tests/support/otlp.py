"""An OTLP/gRPC trace receiver, as an OpenTelemetry Collector's `otlp` receiver is to the gateway.

Built on the protocol's published definitions: opentelemetry-proto's generated
`ExportTraceServiceRequest` and `TraceService`, served by grpcio on a free loopback port. It keeps
every span it is sent, with its resource's attributes, and answers each export with success.

    async with otlp_receiver() as receiver:      # receiver.endpoint: "127.0.0.1:<port>"
        ...                                      # a gateway with `endpoint: <receiver.endpoint>`
        spans = await receiver.wait_for(lambda spans: any(s.name == "authentication" for s in spans))
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.support.polling import until
from tests.support.ports import free_port

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind
CLIENT = 3
INTERNAL = 1
STATUS_ERROR = 2


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector got it: ids as hex, attributes as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_code: int
    start_ns: int
    end_ns: int
    resource: dict[str, Any]

    def event(self, name: str) -> dict[str, Any] | None:
        return next((attrs for n, attrs in self.events if n == name), None)


@dataclass
class Receiver:
    port: int
    spans: list[ReceivedSpan] = field(default_factory=list)
    exports: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id]

    async def wait_for(
        self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0, what: str = "spans"
    ) -> list[ReceivedSpan]:
        await until(lambda: condition(self.spans), timeout=timeout, what=what)
        return self.spans

    def receive(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.exports += 1
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                            status_code=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            resource=resource,
                        )
                    )


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.receiver.receive(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """A running receiver on 127.0.0.1 (insecure gRPC, as the gateway exports)."""
    receiver = Receiver(free_port())
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(receiver.endpoint)
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(grace=None)


def tracing_config(tmp_path: Path, receiver: Receiver, rate: int | None = None) -> str:
    path = tmp_path / "tracing.yaml"
    text = f"apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {receiver.endpoint}\n"
    if rate is not None:
        text += f"samplingRatePerMillion: {rate}\n"
    path.write_text(text)
    return str(path)


def new_parent(sampled: bool = True) -> tuple[str, str, str]:
    """(trace id, span id, traceparent) of a caller's span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def server_span(receiver: Receiver, trace_id: str) -> ReceivedSpan | None:
    return next((s for s in receiver.spans if s.trace_id == trace_id and s.kind == SERVER), None)
