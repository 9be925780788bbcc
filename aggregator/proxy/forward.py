"""Send one request to one destination and stream the answer back: the proxy's hot path.

Shared by the APIService handler and the delegate, on the lean keep-alive client (`h1`). Bodies
stream both ways and are never parsed: the request body is written to the backend as it arrives
(with backpressure; chunked when the client sent no length), response chunks are written as they
come (a watch event reaches the caller when the backend sends it), `Content-Length` and
`Content-Encoding` pass through untouched, and path and query reach the backend byte for byte. A
client that goes away cancels the handler (the server runs with `handler_cancellation=True`),
which closes the backend connection. A redirect becomes a 502 (CVE-2022-3172, `wire/redirects.py`);
transport failures become 503 `error trying to reach service: <cause>`, and a connect or TLS
failure asks availability to re-check that APIService at once (`contracts.Recheck`). Upgrade
requests go to the tunnel. The gateway's own answers are Kubernetes Status objects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field

import aiohttp
from multidict import CIMultiDict

from aggregator.audit.body import BodyCapture
from aggregator.audit.recorder import AUDIT
from aggregator.backends._aiohttp import HttpProcessingError, RawResponseMessage, StreamReader
from aggregator.backends.backend import IDEMPOTENT
from aggregator.backends.bounds import DEFAULT_BOUNDS, Bounds
from aggregator.backends.errors import BackendError, Hop, classify
from aggregator.backends.h1 import DialTimes, Exchange, NotWritten, UnsafeHead, serialize_head
from aggregator.backends.headers import forwarded_headers, forwarded_uri, response_headers
from aggregator.contracts import Recheck
from aggregator.model.userinfo import UserInfo
from aggregator.proxy.destination import Destination
from aggregator.proxy.endpointmetrics import IDEMPOTENT as IDEMPOTENT_RETRY
from aggregator.proxy.endpointmetrics import UNSENT, EndpointMetrics
from aggregator.proxy.endpoints import BAD_ANSWERS, Endpoint, Endpoints
from aggregator.proxy.metrics import ProxyMetrics
from aggregator.proxy.upgrade import BODY_REFUSED, UpgradeTunnel, upgrade_refusal
from aggregator.util.logs import fields
from aggregator.web.accesslog import RETRIED
from aggregator.web.context import RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Increments, Observers
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Answer, Response, StreamedResponse
from aggregator.wire.redirects import (
    NOT_MODIFIED,
    REDIRECT_MESSAGE,
    is_redirect,
    without_redirect_headers,
)

log = logging.getLogger(__name__)

_LOG_EVERY = 10.0


def verb_of(ctx: RequestContext) -> str:
    """The proxy metrics' verb: the HTTP method, or WATCH for a watch (`RequestContext.watch`)."""
    return "WATCH" if ctx.watch else ctx.method


def has_impersonation(ctx: RequestContext) -> str | None:
    """The first `Impersonate-*` header the caller sent, if any."""
    for name in ctx.headers:
        if name[:12].lower() == "impersonate-":
            return name
    return None


# The failures that say the backend itself is gone, rather than slow or misbehaving.
SUSPICIOUS_HOPS = frozenset({Hop.CONNECT, Hop.TLS})
# How a connect that did not finish in time ends (`Backend.dial`).
DIAL_TIMEOUT = ": i/o timeout"
# Go's http.Transport error when ResponseHeaderTimeout passes.
HEADER_TIMEOUT_CAUSE = "net/http: timeout awaiting response headers"
# A connection still not made after this long has the checker look at the APIService at once: a
# TCP connect and TLS handshake take milliseconds in a cluster, and the check then ends within one
# probe timeout of the first client that noticed.
SLOW_DIAL = 0.5


@dataclass(slots=True)
class _Failure:
    """How one attempt failed: `unsent` (the backend never saw the request), on a `reused`
    connection, and whether it says the endpoint itself is broken (`eject`)."""

    error: BackendError
    unsent: bool
    reused: bool
    eject: bool


@dataclass(slots=True, eq=False)
class _Attempts:
    """One request's attempts: where the current one goes, and the bookkeeping of each (the
    endpoint's requests in flight, its answers and failures, metrics, the access log's fields)."""

    ctx: RequestContext
    dest: Destination
    endpoint: Endpoint | None
    endpoints: Endpoints | None
    bounds: Bounds
    user: UserInfo
    raw_path: str  # the request target as the backend gets it, after the destination's base path
    chunked: bool
    metrics: EndpointMetrics | None = None
    tries: int = field(default=0, init=False)
    sent: float = field(default=0.0, init=False)
    # `head_for(dest)`, made again when a retry goes to another endpoint (UnsafeHead: refused).
    head: bytes = field(default=b"", init=False)

    def __post_init__(self) -> None:
        self.head = self.head_for(self.dest)

    def head_for(self, dest: Destination) -> bytes:
        """The request head for `dest` (a method, not a closure: no cells to allocate per request)."""
        ctx = self.ctx
        span = ctx.span
        raw_path = self.raw_path
        headers = forwarded_headers(
            ctx.headers.items() if span is None else span.outgoing(ctx.headers.items()),
            self.user,
            dest.identity.current(),
            authority=dest.authority,
            client_ip=ctx.remote,
            forwarded_uri=forwarded_uri(raw_path),
            impersonate=dest.impersonate,
            extra=dest.credentials,
            hop=dest.hop,
        )
        if self.chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        return serialize_head(ctx.method, dest.base_path + raw_path, headers)

    def begin(self) -> None:
        endpoint = self.endpoint
        if endpoint is not None:
            endpoint.attempts += 1
            if not self.ctx.long_running:
                endpoint.outstanding += 1

    def _leave(self) -> None:
        endpoint = self.endpoint
        if endpoint is not None and not self.ctx.long_running:
            endpoint.outstanding -= 1

    def failed(self) -> None:
        self._leave()

    def answered(self, status: int) -> None:
        dest = self.dest
        self.ctx.add_log_field("endpoint", dest.authority)
        took = time.monotonic() - self.sent
        metrics = self.metrics
        if metrics is not None and status in BAD_ANSWERS:
            metrics.errors(dest.name, dest.authority, "answer").inc()
        span = self.ctx.span
        if span is not None:  # tracing hook: time to first byte
            span.first_byte(dest.authority, status, took)
        if self.endpoint is not None and self.endpoints is not None:
            ejected = self.endpoints.answered(self.endpoint, status, took)
            if ejected and span is not None:  # tracing hook: ejection
                span.ejected(dest.authority, self.endpoint.reason)

    def done(self) -> None:
        """The exchange that answered has ended."""
        self._leave()

    def timed_out(self) -> None:
        """The time for the answer's head ran out during the current attempt (already left)."""
        if self.metrics is not None:
            self.metrics.errors(self.dest.name, self.dest.authority, "timeout").inc()

    def retry_reason(self, failure: _Failure) -> str | None:
        """Why a second attempt is safe, or None: never more than one retry; one that never
        reached the backend whatever its method; an idempotent one without a body (a GET, HEAD or
        OPTIONS, a watch included: nothing of its answer came yet)."""
        error = failure.error
        if self.metrics is not None:
            kind = "reset" if not failure.unsent and error.hop is Hop.CONNECT else error.hop.value
            self.metrics.errors(self.dest.name, self.dest.authority, kind).inc()
        if failure.eject and self.endpoint is not None and self.endpoints is not None:
            ejected = self.endpoints.unreachable(self.endpoint, error.cause)
            if ejected and self.ctx.span is not None:  # tracing hook: ejection
                self.ctx.span.ejected(self.dest.authority, error.cause)
        if self.tries:
            return None
        if failure.unsent:
            if error.cause.endswith(DIAL_TIMEOUT) and not self._elsewhere():
                return None  # the same address again would only wait as long again
            return UNSENT
        if self.ctx.method in IDEMPOTENT and self.ctx.request.body is None:
            return IDEMPOTENT_RETRY
        return None

    def _elsewhere(self) -> bool:
        """Whether a retry could go to another endpoint."""
        return self.endpoints is not None and len(self.endpoints.all) > 1

    def retry(self, failure: _Failure, reason: str) -> None:
        """Move to another endpoint (the same address when there is no other)."""
        dest = self.dest
        if self.metrics is not None:
            self.metrics.retries(dest.name, dest.authority, reason).inc()
        self.ctx.add_log_field(RETRIED, f"{dest.authority}: {failure.error.cause}")
        if self.ctx.span is not None:  # tracing hook: retry
            self.ctx.span.retried(dest.authority, reason, failure.error.cause)
        self.tries += 1
        if self.endpoints is not None and self.endpoint is not None and self._elsewhere():
            self.endpoint = self.endpoints.choose(avoid=self.endpoint)
            if self.endpoint.destination is not dest:
                self.dest = self.endpoint.destination
                self.head = self.head_for(self.dest)


@dataclass(eq=False)
class Forwarder:
    metrics: ProxyMetrics
    tunnel: UpgradeTunnel
    _: KW_ONLY
    recheck: Recheck | None = None
    # Ends long-running answers on shutdown (web/longrunning.py).
    in_flight: InFlight = field(default_factory=InFlight)
    _last_logged: dict[tuple[str, str], float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        # `aggregator_proxy_requests_total{apiservice, verb, code}` and the duration histogram.
        self._requests = Increments(self.metrics.requests)
        self._durations = Observers(self.metrics.duration)
        # Per APIService and endpoint (the delegate's requests are not counted there).
        self.endpoint_metrics = self.metrics.endpoints

    async def send(
        self,
        ctx: RequestContext,
        dest: Destination,
        user: UserInfo,
        *,
        deadline_seconds: float | None = None,
        endpoint: Endpoint | None = None,
        endpoints: Endpoints | None = None,
        bounds: Bounds = DEFAULT_BOUNDS,
    ) -> Answer:
        """Forward (or tunnel, for an upgrade) the request to `dest` as `user`.

        `deadline_seconds` bounds the whole exchange (upstream's 5 s for discovery requests).
        An APIService's request names its first `endpoint` (`dest` is its destination) and the
        `endpoints` a retry may choose from, and its `bounds`: the connect timeout, and the
        response-header timeout, which bounds every attempt together up to the answer's head.
        """
        if ctx.upgrade:
            refusal = upgrade_refusal(ctx.headers)
            if refusal is not None:
                self.metrics.upgrade_rejected.labels("body" if refusal == BODY_REFUSED else "protocol").inc()
                return self.answer(ctx, dest.name, 400, refusal)
            response = await self.tunnel.serve(ctx, dest, user)
            self.count(dest.name, "CONNECT", response.status)
            return response
        raw_path = ctx.target
        if not raw_path.startswith("/"):  # absolute-form request target
            raw_path = ctx.raw_path + ("?" + ctx.raw_query if ctx.raw_query else "")
        has_body = ctx.request.body is not None
        # A body without a length (the client's own chunks) goes chunked; Content-Length crosses as sent.
        chunked = has_body and "Content-Length" not in ctx.headers
        span = ctx.span
        if span is not None:  # tracing hook: the proxied call's span, whose traceparent the backend gets
            span.proxy_started(dest.name, dest.authority, ctx.method, f"https://{dest.authority}{dest.base_path}{raw_path}")
        verb = verb_of(ctx)
        name = dest.name
        deadline = None
        started = time.monotonic()
        header_timeout = bounds.response_header_timeout
        limit = deadline_seconds
        if header_timeout is not None and (limit is None or header_timeout < limit):
            limit = header_timeout
        try:
            attempts = _Attempts(
                ctx,
                dest,
                endpoint,
                endpoints,
                bounds,
                user,
                raw_path,
                chunked,
                self.endpoint_metrics if endpoint is not None else None,
            )
        except UnsafeHead as err:
            log.warning("request refused", extra=fields(method=ctx.method, path=ctx.path, reason=str(err)))
            return self.answer(ctx, name, 400, str(err), verb)
        try:
            if limit:
                now = asyncio.get_running_loop().time()
                if deadline_seconds:
                    deadline = now + deadline_seconds
                async with asyncio.timeout_at(now + limit):
                    answered = await self._attempt(attempts)
                    if isinstance(answered, _Failure):
                        answered = await self._retried(attempts, answered)
            else:
                answered = await self._attempt(attempts)
                if isinstance(answered, _Failure):
                    answered = await self._retried(attempts, answered)
            exchange, message, payload = answered
        except TimeoutError:
            attempts.timed_out()
            if limit == header_timeout and header_timeout is not None:
                # A blackholed backend: the checker should hear of it now, not after its next round.
                if self.recheck is not None:
                    self.recheck.suspect(name)
                return self.unreachable(ctx, name, Hop.TIMEOUT, HEADER_TIMEOUT_CAUSE, verb)
            return self.unreachable(ctx, name, Hop.TIMEOUT, "context deadline exceeded", verb)
        except BackendError as err:
            return self.unreachable(ctx, name, err.hop, err.cause, verb)
        self._durations(name, verb).observe(time.monotonic() - started)
        try:
            return await self._relay(ctx, name, verb, message, payload, dest.pass_redirects, deadline)
        finally:
            exchange.finish()
            attempts.done()

    async def _retried(
        self, attempts: _Attempts, failure: _Failure
    ) -> tuple[Exchange, RawResponseMessage, StreamReader]:
        """After a failed first attempt (`send` makes it itself: most succeed), the request sent
        again when the failure makes a second attempt safe (`_Attempts.retry_reason`); raises
        the last failure in Go's words."""
        while True:
            reason = attempts.retry_reason(failure)
            if reason is None:
                raise failure.error
            attempts.retry(failure, reason)
            answered = await self._attempt(attempts)
            if not isinstance(answered, _Failure):
                return answered
            failure = answered

    async def _attempt(
        self, attempts: _Attempts
    ) -> tuple[Exchange, RawResponseMessage, StreamReader] | _Failure:
        """One attempt on `attempts.dest`: the answer's head, or how it failed."""
        ctx, dest = attempts.ctx, attempts.dest
        backend = dest.backend
        method = ctx.method
        body = ctx.request.body
        audit = AUDIT.get(ctx)
        pool = backend.pool
        attempts.begin()
        exchange = pool.idle_exchange(dest.host, dest.port, dest.server_name)
        reused = exchange is not None
        try:
            if exchange is None:
                exchange = await self._dial(attempts)
            tap = audit.request_capture() if body is not None and audit is not None else None
            attempts.sent = time.monotonic()  # the time to first byte leaves the dial out
            exchange.send(
                attempts.head,
                body,
                chunked=attempts.chunked,
                head_only=method == "HEAD",
                tap=tap,
            )
            message, payload = await exchange.response()
        except BackendError as err:  # the dial: nothing was sent
            attempts.failed()
            return _Failure(err, unsent=True, reused=False, eject=err.hop in SUSPICIOUS_HOPS)
        except NotWritten as err:
            assert exchange is not None
            exchange.finish()
            attempts.failed()
            return _Failure(await backend.describe(err, dest.address), unsent=True, reused=True, eject=False)
        except (aiohttp.ClientError, HttpProcessingError, OSError) as err:
            assert exchange is not None
            exchange.finish()
            attempts.failed()
            # A pooled connection the backend had just closed (EOF) is its keep-alive, not a fault.
            stale = reused and isinstance(err, aiohttp.ServerDisconnectedError)
            return _Failure(
                await backend.describe(err, dest.address), unsent=False, reused=reused, eject=not stale
            )
        except BaseException:
            if exchange is not None:
                exchange.finish()
            attempts.failed()
            raise
        attempts.answered(message.code)
        return exchange, message, payload

    async def _dial(self, attempts: _Attempts) -> Exchange:
        """A new connection for the attempt, timed; one still connecting after `SLOW_DIAL` seconds
        has the checker look at the APIService at once (a blackholed backend is found while this
        request still waits)."""
        dest = attempts.dest
        metrics = attempts.metrics
        span = attempts.ctx.span
        times = DialTimes() if metrics is not None or span is not None else None
        started_ns = time.time_ns() if span is not None else 0
        recheck = self.recheck
        timer = (
            asyncio.get_running_loop().call_later(SLOW_DIAL, recheck.suspect, dest.name)
            if recheck is not None
            else None
        )
        try:
            exchange = await dest.backend.pool.new_exchange(
                dest.host, dest.port, dest.server_name, within=attempts.bounds.connect_timeout, times=times
            )
        finally:
            if timer is not None:
                timer.cancel()
        if times is not None and metrics is not None:
            metrics.dialed(dest.name, dest.authority, times)
        if span is not None and times is not None:  # tracing hook: connect and TLS handshake
            span.dialed(dest.authority, started_ns, times.tcp, times.tls)
        return exchange

    async def _relay(
        self,
        ctx: RequestContext,
        name: str,
        verb: str,
        message: RawResponseMessage,
        payload: StreamReader,
        pass_redirects: bool,
        deadline: float | None,
    ) -> Answer:
        status = message.code
        upstream = message.headers
        if not pass_redirects and is_redirect(status):
            self.metrics.backend_errors.labels(name, Hop.REDIRECT.value).inc()
            log.warning(
                "backend answered with a redirect; refused",
                extra=fields(apiservice=name, status=status, method=ctx.method, path=ctx.path),
            )
            return self.answer(ctx, name, 502, REDIRECT_MESSAGE, verb)
        pairs: Iterable[tuple[str, str]] = upstream.items()
        if status == NOT_MODIFIED and not pass_redirects:
            pairs = without_redirect_headers(pairs)
        headers: CIMultiDict[str] = response_headers(pairs)
        self.count(name, verb, status)
        audit = AUDIT.get(ctx)
        tap = (
            audit.response_capture(headers.get("Content-Type", ""), headers.get("Content-Encoding", ""))
            if audit is not None
            else None
        )
        # A body on its way with a known length: the head leaves with its first bytes (one write
        # for a small answer); one of unknown length (a watch) sends its head at once.
        known_length = not message.chunked and "Content-Length" in upstream
        out = await ctx.request.stream(status, headers, reason=message.reason, head_now=not known_length)
        if not ctx.long_running:
            if await self._stream(ctx, name, payload, out, tap, deadline):
                await out.finish()
            return out
        # A long-running answer (a watch) stops early when the gateway shuts down: it then ends as
        # if the backend had finished it (a chunked one with its last chunk), and client-go starts
        # a new watch, on another replica.
        async with self.in_flight.ending() as ending:
            if not await self._stream(ctx, name, payload, out, tap, deadline):
                return out
        if ending.ended and not out.chunked:
            out.abort()  # only a connection's end can end a body of announced length early
        else:
            await out.finish()
        return out

    async def _stream(
        self,
        ctx: RequestContext,
        name: str,
        payload: StreamReader,
        out: StreamedResponse,
        tap: BodyCapture | None,
        deadline: float | None,
    ) -> bool:
        """Copy the backend's body to the client; False when the backend's answer broke off (the
        client connection is then closed, so the client sees a truncated answer)."""
        while True:
            try:
                if deadline is None:
                    chunk = await payload.readany()
                else:
                    async with asyncio.timeout_at(deadline):
                        chunk = await payload.readany()
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                # Headers are gone already: end the connection so the client sees a truncated
                # answer instead of a complete-looking one.
                hop, cause = classify(err, "")
                self.metrics.backend_errors.labels(name, hop.value).inc()
                log.info(
                    "backend response ended early",
                    extra=fields(apiservice=name, method=ctx.method, path=ctx.path, reason=cause),
                )
                out.abort()
                return False
            if not chunk:
                break
            if tap is not None:
                tap.feed(chunk)
            # A client that went away raises ConnectionResetError here; the pipeline lets it through.
            if payload.is_eof():
                # The whole body is here (a small answer, most of them): head, body and end go
                # out in one write, without another read (the caller's `finish` is then a no-op).
                await out.finish(chunk)
                break
            await out.write(chunk)
        if tap is not None:
            tap.finish()
        return True

    # --- answers and bookkeeping -------------------------------------------------------------------

    def answer(
        self, ctx: RequestContext, name: str, code: int, message: str, verb: str | None = None
    ) -> Response:
        """A Status the gateway writes itself, counted under the destination's name."""
        self.count(name, verb or verb_of(ctx), code)
        response = status_response(ctx, code, message)
        if ctx.upgrade:
            # No tunnel was set up: whatever the client sends next must not be read as a request.
            response.force_close()
        return response

    def unreachable(self, ctx: RequestContext, name: str, hop: Hop, cause: str, verb: str) -> Response:
        self.metrics.backend_errors.labels(name, hop.value).inc()
        if ctx.span is not None:  # tracing hook: the proxied call failed
            ctx.span.proxy_failed(hop.value, cause)
        if self.recheck is not None and hop in SUSPICIOUS_HOPS:
            self.recheck.suspect(name)
        self.log_limited(
            name,
            cause,
            "error trying to reach service",
            apiservice=name,
            hop=hop.value,
            method=ctx.method,
            path=ctx.path,
            reason=cause,
        )
        return self.answer(ctx, name, 503, f"error trying to reach service: {cause}", verb)

    def unresolvable(self, ctx: RequestContext, name: str, err: BackendError) -> Response:
        """Upstream's answer when no address can be found: 503 `service unavailable`, reason logged."""
        self.metrics.backend_errors.labels(name, err.hop.value).inc()
        self.log_limited(
            name,
            err.cause,
            "service unavailable: cannot resolve the backend",
            apiservice=name,
            hop=err.hop.value,
            method=ctx.method,
            path=ctx.path,
            reason=err.cause,
        )
        return self.answer(ctx, name, 503, "service unavailable")

    def log_limited(self, name: str, cause: str, message: str, **values: object) -> None:
        """One line per destination and cause every 10 s: a broken backend must not flood the log."""
        now = time.monotonic()
        key = (name, cause)
        last = self._last_logged.get(key)
        if last is not None and now - last < _LOG_EVERY:
            return
        if len(self._last_logged) > 1024:
            self._last_logged.clear()
        self._last_logged[key] = now
        log.warning(message, extra=fields(**values))

    def count(self, name: str, verb: str, code: int) -> None:
        self._requests(name, verb, code)(1)
