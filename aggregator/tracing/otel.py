"""Request spans over the OpenTelemetry SDK, exported over OTLP/gRPC, as kube-apiserver traces.

Upstream (component-base `tracing.NewProvider`, apiserver `filters.WithTracing`, kube-aggregator's
proxy transport wrapped with `tracing.WrapperFor`):
- sampler `ParentBased(TraceIDRatioBased(samplingRatePerMillion / 1e6))`, `NeverSample` for the
  root when the rate is unset or 0: a caller's sampled `traceparent` is always honoured;
- a batch span processor and the OTLP gRPC exporter, insecure, to `endpoint` (default
  `localhost:4317`); resource `service.name` (here `aggregator`) and `service.instance.id`;
- the server span named like `WithTracing` names it (the method, or `GET
  /apis/<group>/<version>/namespaces/{:namespace}/<resource>/{:name}` for a resource request),
  with otelhttp's semantic-convention attributes (v1.17) and kube-apiserver's `audit-id`;
- W3C Trace Context to the proxied call, whose client span is the backend's parent.

One difference, on purpose: kube-apiserver treats its endpoint as public (`WithPublicEndpoint`):
a caller's trace becomes a link of a new root. The gateway continues the caller's trace, so one
trace shows client, gateway and backend (docs/differences.md).

The phases (`api.RequestSpan`) are child spans: `authentication` and `authorization` (with
`TokenReview` / `SubjectAccessReview` client spans when a review is made), `priority-and-fairness`
once that gate is wired, and the proxied call `HTTP <method>` (client kind) with its `connect` and
`TLS handshake` child spans for a new connection, and events for the first byte, retries and
ejections. Nothing is built before the first sampled request (a `--workers N` control process,
which serves no request, never starts an exporter); each worker process exports its own spans.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    format_span_id,
    format_trace_id,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from aggregator.tracing.api import TRACEPARENT, TRACESTATE, ClientSpan, PhaseSpan, RequestSpan
from aggregator.tracing.config import TracingConfiguration

DEFAULT_ENDPOINT = "localhost:4317"
SERVICE_NAME = "aggregator"
# The instrumentation scope of every span (upstream: k8s.io/component-base/tracing).
SCOPE = "aggregator.dev/gateway"
AUDIT_ID = "Audit-ID"
_PROTOCOL_VERSION = {"HTTP/1.1": "1.1", "HTTP/2.0": "2"}


class RequestInfoLike(Protocol):
    """`web.requestinfo.RequestInfo` (a NamedTuple: read-only fields)."""

    @property
    def is_resource_request(self) -> bool: ...
    @property
    def api_prefix(self) -> str: ...
    @property
    def api_group(self) -> str: ...
    @property
    def api_version(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def subresource(self) -> str: ...
    @property
    def name(self) -> str: ...


class ConnectionLike(Protocol):
    protocol: str


class Traced(Protocol):
    """What the tracer reads of a request (`web.context.RequestContext`)."""

    method: str
    target: str
    status: int | None
    span: RequestSpan | None

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def info(self) -> RequestInfoLike | None: ...

    @property
    def connection(self) -> ConnectionLike: ...

    @property
    def remote(self) -> str | None: ...


def _sampled(traceparent: str) -> bool:
    """The sampled flag of a well-formed version-00 `traceparent`; True when unsure (the SDK decides)."""
    if len(traceparent) != 55:
        return True
    try:
        return bool(int(traceparent[53:], 16) & 1)
    except ValueError:
        return True


def span_name(method: str, info: RequestInfoLike | None) -> str:
    """`WithTracing`'s span name (`getSpanNameFromRequestInfo`)."""
    if info is None or not info.is_resource_request:
        return method
    name = "/" + info.api_prefix
    if info.api_group:
        name += "/" + info.api_group
    name += "/" + info.api_version
    if info.namespace:
        name += "/namespaces/{:namespace}"
    name += "/" + info.resource
    if info.name:
        name += "/{:name}"
    if info.subresource:
        name += "/" + info.subresource
    return f"{method} {name}"


def service_instance_id() -> str:
    """kube-apiserver's `APIServerID` form (`apiserver-<uuid5 of the hostname>`), for the gateway."""
    host = socket.gethostname()
    return f"{SERVICE_NAME}-{uuid.uuid5(uuid.UUID(int=0), host + SERVICE_NAME)}"


def sampler_for(config: TracingConfiguration) -> Sampler:
    """`ParentBased(TraceIDRatioBased(rate))`, `ParentBased(NeverSample)` without a positive rate."""
    ratio = config.sampling_ratio
    return ParentBased(TraceIdRatioBased(ratio) if ratio > 0 else ALWAYS_OFF)


def otlp_processor(config: TracingConfiguration) -> SpanProcessor:
    """Batched export over OTLP/gRPC, insecure, as `otlptracegrpc.WithInsecure()`."""
    return BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint or DEFAULT_ENDPOINT, insecure=True))


def _error(span: Span, status: int | None, error: str | None, *, server: bool) -> None:
    if status is not None:
        span.set_attribute("http.status_code", status)
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    elif status is not None and (status >= 500 or (not server and status >= 400)):
        # otelhttp: a server span is an error from 5xx on, a client span from 4xx on.
        span.set_status(Status(StatusCode.ERROR))


class _Client:
    """A client span (a review, the proxied call): its own context goes to the callee."""

    __slots__ = ("_span", "_state")

    def __init__(self, span: Span, state: str) -> None:
        self._span = span
        self._state = state

    def headers(self) -> dict[str, str]:
        sc = self._span.get_span_context()
        out = {TRACEPARENT: f"00-{format_trace_id(sc.trace_id)}-{format_span_id(sc.span_id)}-{sc.trace_flags:02x}"}
        if self._state:
            out[TRACESTATE] = self._state
        return out

    def end(self, status: int | None = None, error: str | None = None) -> None:
        _error(self._span, status, error, server=False)
        self._span.end()


class _Phase:
    __slots__ = ("_span", "_state", "_tracer")

    def __init__(self, tracer: Tracer, span: Span, state: str) -> None:
        self._tracer = tracer
        self._span = span
        self._state = state

    def client(self, name: str, *, method: str, url: str) -> ClientSpan:
        span = self._tracer.start_span(
            name,
            context=set_span_in_context(self._span),
            kind=SpanKind.CLIENT,
            attributes={"http.method": method, "http.url": url},
        )
        return _Client(span, self._state)

    def end(self, status: int | None = None, error: str | None = None) -> None:
        _error(self._span, status, error, server=False)
        self._span.end()


class OtelRequestSpan:
    """`api.RequestSpan` over one SDK server span."""

    __slots__ = ("_call", "_context", "_span", "_state", "_tracer")

    def __init__(self, tracer: Tracer, span: Span, state: str) -> None:
        self._tracer = tracer
        self._span = span
        self._context = set_span_in_context(span)
        self._state = state  # the caller's tracestate, carried along
        self._call: _Client | None = None  # the proxied call, while it is open

    @property
    def span(self) -> Span:
        return self._span

    def phase(self, name: str) -> PhaseSpan:
        return _Phase(self._tracer, self._tracer.start_span(name, context=self._context), self._state)

    def proxy_started(self, apiservice: str, authority: str, method: str, url: str) -> None:
        host, _, port = authority.rpartition(":")
        attributes: dict[str, Any] = {
            "http.method": method,
            "http.url": url,
            "net.peer.name": host,
            "apiservice": apiservice,
        }
        if port.isdigit():
            attributes["net.peer.port"] = int(port)
        span = self._tracer.start_span(
            f"HTTP {method}", context=self._context, kind=SpanKind.CLIENT, attributes=attributes
        )
        self._call = _Client(span, self._state)

    def outgoing(self, headers: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
        call = self._call
        if call is None:
            return headers
        kept = [(k, v) for k, v in headers if k.lower() not in (TRACEPARENT, TRACESTATE)]
        kept.extend(call.headers().items())
        return kept

    def _call_span(self) -> Span | None:
        return self._call._span if self._call is not None else None

    def dialed(self, endpoint: str, started_ns: int, tcp: float | None, tls: float | None) -> None:
        parent = self._call_span()
        if parent is None:
            return
        context = set_span_in_context(parent)
        attributes = {"endpoint": endpoint}
        if tcp is None:
            # Not timed phase by phase (a name dialed, not an address): the whole dial.
            span = self._tracer.start_span("dial", context=context, attributes=attributes, start_time=started_ns)
            span.end()
            return
        connected = started_ns + int(tcp * 1e9)
        self._tracer.start_span("connect", context=context, attributes=attributes, start_time=started_ns).end(
            end_time=connected
        )
        if tls is not None:
            self._tracer.start_span(
                "TLS handshake", context=context, attributes=attributes, start_time=connected
            ).end(end_time=connected + int(tls * 1e9))

    def first_byte(self, endpoint: str, status: int, seconds: float) -> None:
        span = self._call_span()
        if span is not None:
            span.set_attribute("endpoint", endpoint)
            span.set_attribute("time_to_first_byte_seconds", seconds)
            span.add_event("first byte", {"endpoint": endpoint, "http.status_code": status})

    def retried(self, endpoint: str, reason: str, cause: str) -> None:
        span = self._call_span()
        if span is not None:
            span.add_event("retry", {"endpoint": endpoint, "reason": reason, "cause": cause})

    def ejected(self, endpoint: str, reason: str) -> None:
        span = self._call_span()
        if span is not None:
            span.add_event("ejection", {"endpoint": endpoint, "reason": reason})

    def proxy_failed(self, hop: str, cause: str) -> None:
        call = self._call
        if call is not None:
            call._span.set_attribute("hop", hop)
            call.end(error=cause)
            self._call = None

    def finish(self, status: int | None, error: str | None, audit_id: str | None) -> None:
        """The request is over (its answer written, or the client gone: `status` None)."""
        if self._call is not None:
            self._call.end(status)
            self._call = None
        if audit_id:
            self._span.set_attribute("audit-id", audit_id)
        _error(self._span, status, error, server=True)
        self._span.end()


class OtelTracing:
    """The process's tracer: `begin` a request's span (None when not sampled), `finished` ends it.

    `processor` builds what exports the spans (the OTLP batch processor; tests may pass another);
    it is called at the first sampled request. `audit_id` reads a request's audit ID (auditing's).
    """

    def __init__(
        self,
        config: TracingConfiguration,
        *,
        processor: Callable[[TracingConfiguration], SpanProcessor] = otlp_processor,
        clock_ns: Callable[[], int] = time.time_ns,
        audit_id: Callable[[Any], str | None] = lambda _ctx: None,
    ) -> None:
        self.config = config
        # The request's audit ID where auditing keeps it (`audit.recorder.AUDIT_ID`).
        self._audit_id = audit_id
        self.ratio = config.sampling_ratio
        self._processor = processor
        self._clock_ns = clock_ns
        self._propagator = TraceContextTextMapPropagator()
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            resource = Resource.create(
                {"service.name": SERVICE_NAME, "service.instance.id": service_instance_id(), "process.pid": os.getpid()}
            )
            provider = TracerProvider(sampler=sampler_for(self.config), resource=resource)
            provider.add_span_processor(self._processor(self.config))
            self._provider = provider
            self._tracer = provider.get_tracer(SCOPE)
        return self._tracer

    def begin(self, ctx: Traced) -> RequestSpan | None:
        """A span for this request when it is sampled; None (and nothing built) otherwise."""
        headers = ctx.headers
        traceparent = headers.get(TRACEPARENT)
        if traceparent is None:
            if not self.ratio:
                return None  # NeverSample as the root, and no parent: the fast path
            parent: Context | None = None
        elif not self.ratio and not _sampled(traceparent):
            return None  # a parent that is not sampled, and no root sampling: ParentBased says no
        else:
            parent = self._propagator.extract(headers)
        tracer = self._get_tracer()
        received_ns = self._clock_ns()
        attributes: dict[str, Any] = {
            "http.method": ctx.method,
            "http.target": ctx.target,
            "http.scheme": "https",
            "http.flavor": _PROTOCOL_VERSION.get(ctx.connection.protocol, ctx.connection.protocol),
        }
        if ctx.remote:
            attributes["net.sock.peer.addr"] = ctx.remote
        agent = headers.get("User-Agent")
        if agent:
            attributes["http.user_agent"] = agent
        span = tracer.start_span(
            span_name(ctx.method, ctx.info),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=received_ns,
        )
        if not span.is_recording():
            return None
        state = headers.get(TRACESTATE, "") if traceparent is not None else ""
        return OtelRequestSpan(tracer, span, state)

    def finished(self, ctx: Traced, response: object, error: BaseException | None) -> None:
        """A pipeline finisher: the request's span ends with its status and audit ID."""
        span = ctx.span
        if isinstance(span, OtelRequestSpan):
            status = ctx.status if ctx.status is not None else getattr(response, "status", None)
            # The audit ID (with an audit policy), else the caller's own `Audit-ID`, as kube-apiserver
            # takes it (`WithAuditInit`).
            audit_id = self._audit_id(ctx) or ctx.headers.get(AUDIT_ID)
            span.finish(status, f"{type(error).__name__}: {error}" if error is not None else None, audit_id)

    async def start(self) -> None:
        """Nothing to start: the exporter is built at the first sampled request."""

    async def stop(self) -> None:
        """Export what is still batched, then close the exporter (the SDK blocks: a thread)."""
        provider = self._provider
        if provider is not None:
            await asyncio.to_thread(provider.shutdown)
