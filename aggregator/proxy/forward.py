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

import aiohttp
from aiohttp import web
from aiohttp.http import RawResponseMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader

from aggregator.backends.backend import IDEMPOTENT
from aggregator.backends.errors import BackendError, Hop, classify
from aggregator.backends.h1 import Exchange, serialize_head
from aggregator.backends.headers import forwarded_headers, forwarded_uri, response_headers
from aggregator.contracts import Recheck
from aggregator.model.userinfo import UserInfo
from aggregator.proxy.destination import Destination
from aggregator.proxy.upgrade import UpgradeTunnel, upgrade_refusal
from aggregator.util._aiohttp import HeadersWithBody
from aggregator.util.logs import fields
from aggregator.web.context import BodyTap, RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Children, Metrics
from aggregator.web.responses import status_response
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


class Forwarder:
    def __init__(
        self,
        metrics: Metrics,
        tunnel: UpgradeTunnel,
        *,
        recheck: Recheck | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        self.metrics = metrics
        self.tunnel = tunnel
        self.recheck = recheck
        # Ends long-running answers on shutdown (web/longrunning.py).
        self.in_flight = in_flight or InFlight()
        # `aggregator_proxy_requests_total{apiservice, verb, code}` and the duration histogram.
        self._requests = Children(metrics.proxy_requests)
        self._durations = Children(metrics.proxy_duration)
        self._last_logged: dict[tuple[str, str], float] = {}

    async def send(
        self,
        ctx: RequestContext,
        dest: Destination,
        user: UserInfo,
        *,
        deadline_seconds: float | None = None,
    ) -> web.StreamResponse:
        """Forward (or tunnel, for an upgrade) the request to `dest` as `user`.

        `deadline_seconds` bounds the whole exchange (upstream's 5 s for discovery requests).
        """
        if ctx.upgrade:
            refusal = upgrade_refusal(ctx.headers)
            if refusal is not None:
                self.metrics.upgrade_rejected.labels("protocol").inc()
                return self.answer(ctx, dest.name, 400, refusal)
            response = await self.tunnel.serve(ctx, dest, user)
            self.count(dest.name, "CONNECT", response.status)
            return response
        request = ctx.request
        raw_path = ctx.target
        if not raw_path.startswith("/"):  # absolute-form request target
            raw_path = ctx.raw_path + ("?" + ctx.raw_query if ctx.raw_query else "")
        headers = forwarded_headers(
            ctx.headers.items(),
            user,
            dest.policy,
            authority=dest.authority,
            client_ip=ctx.remote,
            forwarded_uri=forwarded_uri(raw_path),
            impersonate=dest.impersonate,
            extra=dest.credentials,
            hop=dest.hop,
        )
        method = ctx.method
        has_body = request.body_exists
        chunked = has_body and not any(name.lower() == "content-length" for name, _ in headers)
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        head = serialize_head(method, dest.base_path + raw_path, headers)
        verb = verb_of(ctx)
        name = dest.name
        deadline = None
        started = time.monotonic()
        try:
            if deadline_seconds:
                deadline = asyncio.get_running_loop().time() + deadline_seconds
                async with asyncio.timeout_at(deadline):
                    exchange, message, payload = await self._exchange(ctx, dest, head, has_body, chunked)
            else:
                exchange, message, payload = await self._exchange(ctx, dest, head, has_body, chunked)
        except TimeoutError:
            return self.unreachable(ctx, name, Hop.TIMEOUT, "context deadline exceeded", verb)
        except BackendError as err:
            return self.unreachable(ctx, name, err.hop, err.cause, verb)
        self._durations(name, verb).observe(time.monotonic() - started)
        try:
            return await self._relay(ctx, name, verb, message, payload, dest.pass_redirects, deadline)
        finally:
            exchange.finish()

    async def _exchange(
        self, ctx: RequestContext, dest: Destination, head: bytes, has_body: bool, chunked: bool
    ) -> tuple[Exchange, RawResponseMessage, StreamReader]:
        """Send the request and wait for the answer's head; raises BackendError in Go's words."""
        backend = dest.backend
        method = ctx.method
        audit = ctx.audit
        tap = audit.request_capture() if has_body and audit is not None else None
        pool = backend.pool
        for attempt in (1, 2):
            exchange = pool.idle_exchange(dest.host, dest.port, dest.server_name)
            if exchange is None:
                exchange = await pool.new_exchange(dest.host, dest.port, dest.server_name)
            try:
                exchange.send(
                    head,
                    ctx.request.content if has_body else None,
                    chunked=chunked,
                    head_only=method == "HEAD",
                    tap=tap,
                )
                message, payload = await exchange.response()
                return exchange, message, payload
            except aiohttp.ServerDisconnectedError as err:
                exchange.finish()
                # A pooled connection the backend had just closed: Go retries such requests once.
                if attempt == 1 and exchange.reused and not has_body and method in IDEMPOTENT:
                    continue
                raise await backend.describe(err, dest.address) from err
            except (aiohttp.ClientError, HttpProcessingError, OSError) as err:
                exchange.finish()
                raise await backend.describe(err, dest.address) from err
            except BaseException:
                exchange.finish()
                raise
        raise AssertionError("unreachable")

    async def _relay(
        self,
        ctx: RequestContext,
        name: str,
        verb: str,
        message: RawResponseMessage,
        payload: StreamReader,
        pass_redirects: bool,
        deadline: float | None,
    ) -> web.StreamResponse:
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
        headers = response_headers(pairs)
        cls = HeadersWithBody if not message.chunked and "Content-Length" in upstream else web.StreamResponse
        out = cls(status=status, reason=message.reason or None, headers=headers)
        self.count(name, verb, status)
        audit = ctx.audit
        tap = (
            audit.response_capture(headers.get("Content-Type", ""), headers.get("Content-Encoding", ""))
            if audit is not None
            else None
        )
        request = ctx.request
        await out.prepare(request)
        if not ctx.long_running:
            if await self._stream(ctx, name, payload, out, tap, deadline):
                await out.write_eof()
            return out
        # A long-running answer (a watch) stops early when the gateway shuts down: it then ends as
        # if the backend had finished it (a chunked one with its last chunk), and client-go starts
        # a new watch, on another replica.
        async with self.in_flight.ending() as ending:
            if not await self._stream(ctx, name, payload, out, tap, deadline):
                return out
        await out.write_eof()
        if ending.ended and not out.chunked and request.transport is not None:
            request.transport.close()  # only a connection's end can end a body without chunks
        return out

    async def _stream(
        self,
        ctx: RequestContext,
        name: str,
        payload: StreamReader,
        out: web.StreamResponse,
        tap: BodyTap | None,
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
                transport = ctx.request.transport
                if transport is not None:
                    transport.close()
                return False
            if not chunk:
                break
            if tap is not None:
                tap.feed(chunk)
            # A client that went away raises ConnectionResetError here; the pipeline lets it through.
            if payload.is_eof():
                # The whole body is here (a small answer, most of them): head, body and end go
                # out in one write, without another read (the caller's `write_eof` is then a no-op).
                await out.write_eof(chunk)
                break
            await out.write(chunk)
        if tap is not None:
            tap.finish()
        return True

    # --- answers and bookkeeping -------------------------------------------------------------------

    def answer(
        self, ctx: RequestContext, name: str, code: int, message: str, verb: str | None = None
    ) -> web.Response:
        """A Status the gateway writes itself, counted under the destination's name."""
        self.count(name, verb or verb_of(ctx), code)
        response = status_response(ctx, code, message)
        if ctx.upgrade:
            # No tunnel was set up: whatever the client sends next must not be read as a request.
            response.force_close()
        return response

    def unreachable(self, ctx: RequestContext, name: str, hop: Hop, cause: str, verb: str) -> web.Response:
        self.metrics.backend_errors.labels(name, hop.value).inc()
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

    def unresolvable(self, ctx: RequestContext, name: str, err: BackendError) -> web.Response:
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
        self._requests(name, verb, code).inc()
