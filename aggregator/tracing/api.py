"""What the request path sees of a request's trace: narrow protocols, no OpenTelemetry import.

A request that is not sampled has no span (`RequestContext.span` is None) and every hook is one
`is None` test: with `--tracing-config-file` at a sampling rate of 0, only a request whose caller
sent a sampled `traceparent` costs more. The implementation is `otel.py`.

Review calls (TokenReview, SubjectAccessReview) happen deep inside the authentication and
authorization caches, which know nothing of the request: the phase span they belong to is the
*active phase* of the running task (`active_phase`), a `ContextVar` that the phase's gate wrapper
sets while the gate runs (`gates.py`). Its value is per asyncio task, never shared: each request
runs in its own task, and a coalesced review runs in a task copied from the first caller's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from typing import Any, Protocol

# W3C Trace Context (https://www.w3.org/TR/trace-context/): the headers a traced call carries.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


class PhaseSpan(Protocol):
    """One phase of a request (authentication, authorization, fairness) or a review call in it."""

    def client(self, name: str, *, method: str, url: str) -> ClientSpan:
        """A client call made during this phase (a review to kube-apiserver)."""
        ...

    def end(self, status: int | None = None, error: str | None = None) -> None:
        """The phase is over: `status` is the answer it gave (a 401, a 403), if it gave one."""
        ...


class ClientSpan(Protocol):
    def headers(self) -> dict[str, str]:
        """`traceparent` (and `tracestate`) naming this span as the callee's parent."""
        ...

    def end(self, status: int | None = None, error: str | None = None) -> None: ...


class RequestSpan(Protocol):
    """A sampled request's span (the server span), and the calls at its phase boundaries."""

    def phase(self, name: str) -> PhaseSpan: ...

    def proxy_started(self, apiservice: str, authority: str, method: str, url: str) -> None:
        """The proxied call (to an extension server, or kube-apiserver) begins."""
        ...

    def outgoing(self, headers: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
        """The request's headers for the proxied call: the caller's `traceparent`/`tracestate`
        replaced by the proxied call's own, so the backend's span is a child of the gateway's."""
        ...

    def dialed(self, endpoint: str, started_ns: int, tcp: float | None, tls: float | None) -> None:
        """A new connection was made for the proxied call (TCP connect and TLS handshake)."""
        ...

    def first_byte(self, endpoint: str, status: int, seconds: float) -> None:
        """The answer's head arrived `seconds` after the request was sent."""
        ...

    def retried(self, endpoint: str, reason: str, cause: str) -> None: ...

    def ejected(self, endpoint: str, reason: str) -> None: ...

    def proxy_failed(self, hop: str, cause: str) -> None: ...


class RequestTracer(Protocol):
    """A process's tracer as the composition root wires it (`otel.OtelTracing`): a `Component`,
    the pipeline's `begin` hook and one of its finishers. `ctx` is the request's context."""

    def begin(self, ctx: Any) -> RequestSpan | None: ...

    def finished(self, ctx: Any, response: Any, error: BaseException | None) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Per asyncio task (a ContextVar, as Python's OpenTelemetry API keeps its current span): not state
# shared between requests. Set only by `gates.traced_gate`, read only by the review clients.
ACTIVE_PHASE: contextvars.ContextVar[PhaseSpan | None] = contextvars.ContextVar(
    "aggregator_active_phase", default=None
)


def active_phase() -> PhaseSpan | None:
    """The traced phase the running task is in (None: not traced, or in no phase)."""
    return ACTIVE_PHASE.get()
