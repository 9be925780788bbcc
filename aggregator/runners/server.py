"""The listener and the process runner: serve one gateway on its TLS port until told to stop.

`GatewayServer` loads the serving certificate (hot-reloaded), starts the gateway's components,
then listens with aiohttp's low-level server: the pipeline is the one handler, with no URL
dispatcher or middleware chain in front of the gateway's own router; each connection's peer and
TLS session are recorded once (`web.connection.Connection`). Connections that negotiate `h2` are
served by `web.http2` (libnghttp2) instead, into the same pipeline; where libnghttp2 cannot be
loaded the listener offers HTTP/1.1 only and says why once. `serve` runs it until SIGTERM or
SIGINT, then `shut_down` stops it gracefully; `run` is what `aggregator serve` calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from aiohttp import web

from aggregator import __version__
from aggregator.assembly import Gateway, build_gateway
from aggregator.config import Config
from aggregator.runners.serving import CLOSE_TIMEOUT, serving_certificate
from aggregator.tls.options import ServingConfig
from aggregator.util.flags import ConfigError
from aggregator.util.logs import fields
from aggregator.util.runtime import (
    TerminationSignals,
    new_event_loop,
    release_collector,
    settle_heap,
    settle_heap_later,
    start_server_process,
)
from aggregator.util.tasks import TaskSet
from aggregator.web.certexpiry import SERVING
from aggregator.web.connection import Connection
from aggregator.web.http1.request import serve_http1
from aggregator.web.http1.server import GatewayRequest, TimedServer, TimedSite, close_connections
from aggregator.web.http2 import nghttp2
from aggregator.web.http2.limits import H2Limits
from aggregator.web.http2.listener import dispatching
from aggregator.web.http2.metrics import ConnectionMetrics, PenaltyMetrics
from aggregator.web.http2.penalty import FloodPenalty, Penalties
from aggregator.web.http2.serving import Http2Serving
from aggregator.web.http2.tarpit import Tarpit
from aggregator.web.options import ShutdownConfig

log = logging.getLogger(__name__)

# Request bodies the gateway reads itself (it streams everything it proxies).
CLIENT_MAX_SIZE = 3 * 1024 * 1024
LISTEN_BACKLOG = 1024
# kube-apiserver's http.Server (k8s.io/apiserver pkg/server/secure_serving.go, no flags): a request
# head must arrive within 32 s ("just shy of requestTimeoutUpperBound"), and a connection with no
# request in flight is closed after 90 s ("matches http.DefaultTransport keep-alive timeout").
READ_HEADER_TIMEOUT = 32.0
IDLE_TIMEOUT = 90.0


def http2_library(serving: ServingConfig) -> nghttp2.Nghttp2 | None:
    """libnghttp2 when HTTP/2 is to be served (and a line saying which header collector it uses);
    None (and a warning naming why) when it cannot be."""
    if not serving.http2:
        return None
    binding, why = nghttp2.load()
    if binding is None:
        log.warning(
            "HTTP/2 is not served: clients will use HTTP/1.1",
            extra=fields(
                reason=why, fix="install libnghttp2 (Debian and Ubuntu: apt-get install libnghttp2-14)"
            ),
        )
    else:  # which collects request headers: the compiled callback, or Python (nghttp2.py)
        log.info("HTTP/2 served by libnghttp2", extra=fields(detail=why))
    return binding


class GatewayServer:
    """A gateway listening on its TLS port: what `serve` runs, and what tests start in-process."""

    def __init__(self, config: Config, gateway: Gateway | None = None, *, reuse_port: bool = False) -> None:
        self.config = config
        library = http2_library(config.serving)
        self.serving = serving_certificate(config, http2=library is not None)
        self.gateway = gateway or build_gateway(config)
        self.gateway.metrics.exposition.certificate_expiry.follow(
            SERVING, lambda: (self.serving.cert_file, [self.serving.current.leaf])
        )
        # `--workers N`: every worker listens on the same port; the kernel spreads connections.
        self.reuse_port = reuse_port
        self.connection_metrics = ConnectionMetrics(self.gateway.metrics.registry)
        self.http2: Http2Serving | None = None
        # Addresses whose HTTP/2 connection was cut for a flood, held before their next handshakes.
        self.penalties = Penalties(FloodPenalty(), PenaltyMetrics(self.gateway.metrics.registry))
        self._tarpit: Tarpit | None = None
        if library is not None:
            self.http2 = Http2Serving(
                self.gateway.pipeline.handle,
                H2Limits.for_flag(config.serving.http2_max_streams_per_connection),
                self.connection_metrics,
                library,
                self.penalties,
            )
        self.read_header_timeout = READ_HEADER_TIMEOUT
        self.idle_timeout = IDLE_TIMEOUT
        self.port = 0
        self._runner: web.ServerRunner | None = None
        self._site: TimedSite | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host = self.config.serving.bind_address
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"https://{host}:{self.port}"

    def _low_level_server(self) -> web.Server:
        loop = asyncio.get_running_loop()

        def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.Request:
            return GatewayRequest(
                message, payload, protocol, writer, task, loop, client_max_size=CLIENT_MAX_SIZE
            )

        return TimedServer(
            serve_http1(self.gateway.pipeline.handle),
            read_header_timeout=self.read_header_timeout,
            request_factory=make_request,
            connection_factory=Connection.of_transport,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self.idle_timeout,
            max_line_size=65536,
            max_field_size=65536,
        )

    async def start(self) -> int:
        await self.gateway.start()
        self._runner = web.ServerRunner(self._low_level_server(), shutdown_timeout=CLOSE_TIMEOUT)
        await self._runner.setup()
        assert self._runner.server is not None
        dispatch = dispatching(self._runner.server, self.http2, self.connection_metrics)
        # A connection from an address penalised for a flood waits in the tarpit before it is served.
        self._tarpit = Tarpit(dispatch, self.penalties)
        site = TimedSite(
            self._runner,
            self.config.serving.bind_address,
            self.config.serving.port,
            ssl_context=self.serving.context,
            backlog=LISTEN_BACKLOG,
            reuse_port=self.reuse_port or None,
            ssl_handshake_timeout=self.read_header_timeout,  # Go's tlsHandshakeTimeout
            protocol_factory=self._tarpit,
        )
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            await self.gateway.stop()
            address = f"{self.config.serving.bind_address}:{self.config.serving.port}"
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise ConfigError("--secure-port", f"cannot listen on {address}: {reason}") from err
        self._site = site
        self.serving.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.config.serving.port
        log.info(
            "serving",
            extra=fields(
                mode="local" if self.config.source.local_mode else "kube",
                address=f"https://{self.config.serving.bind_address}:{self.port}",
                objects=self.config.source.apiservices_dir or self.config.source.kubeconfig or "in-cluster",
                auth=", ".join(self.gateway.auth_summary) or "none configured",
                version=__version__,
            ),
        )
        return self.port

    async def stop_listening(self) -> None:
        """NotAcceptingNewRequest: close the listener and idle keep-alive connections; busy
        connections close once their response is done (Go's `Server.Shutdown`), and new requests
        that still arrive on one are refused. HTTP/2 connections get a GOAWAY naming the last
        stream they sent: those streams are served to the end, later ones refused."""
        self.gateway.in_flight.stop_accepting()
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            close_connections(self._runner.server)
        if self.http2 is not None:
            self.http2.shut_down()

    async def close(self) -> None:
        """Close the connections still open (cancelling what outlived its drain bound), then stop
        the gateway's components in reverse start order."""
        if self._closed:
            return
        self._closed = True
        self.gateway.shutting_down = True
        await self.serving.stop()
        if self._tarpit is not None:
            self._tarpit.close()
        if self.http2 is not None:
            self.http2.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.gateway.stop()

    async def stop(self, *, request_grace: float | None = None) -> None:
        """Stop now: no delay, long-running requests ended at once, ordinary ones drained (for
        --request-timeout unless `request_grace` says otherwise)."""
        grace = self.config.requests.request_timeout if request_grace is None else request_grace
        await shut_down(self, ShutdownConfig(request_grace=grace))


async def shut_down(server: GatewayServer, shutdown: ShutdownConfig) -> None:
    """kube-apiserver's graceful termination (genericapiserver.go `RunWithContext`), in its order.

    1. ShutdownInitiated: `/readyz` fails at once (its `shutdown` check), everything else serves;
    2. after `delay` (--shutdown-delay-duration), NotAcceptingNewRequest: the listener closes;
    3. together: ordinary requests drain for up to `request_grace` (the request timeout), and
       long-running ones (watches, tunnels) are ended within `watch_grace`
       (--shutdown-watch-termination-grace-period; at once when 0);
    4. the server closes what is left, then the components stop.
    """
    delay, watch_grace, request_grace = shutdown.delay, shutdown.watch_grace, shutdown.request_grace
    gateway = server.gateway
    gateway.shutting_down = True
    if delay > 0:
        log.info("shutting down: /readyz fails, still serving", extra=fields(delay_seconds=delay))
        await asyncio.sleep(delay)
    await server.stop_listening()
    in_flight = gateway.in_flight
    busy, long_running = in_flight.ordinary, in_flight.long_running
    left, still_running = await asyncio.gather(
        in_flight.drain(request_grace), in_flight.end_long_running(watch_grace)
    )
    if busy or long_running or left or still_running:
        log.info(
            "requests in flight drained",
            extra=fields(
                requests=busy, requests_cut=left, long_running=long_running, long_running_cut=still_running
            ),
        )
    await server.close()


async def serve(config: Config) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code (0, as kube-apiserver's; 1 when
    a second signal cut the graceful shutdown short, as component-base's `SetupSignalContext`)."""
    signals = TerminationSignals()
    server = GatewayServer(config)
    tasks = TaskSet("serve")
    server.gateway.store.when_synced(tasks, release_collector, name="release-collector")
    await server.start()
    settle_heap()
    settling = asyncio.ensure_future(settle_heap_later())
    received = await signals.first()
    settling.cancel()
    log.info("shutting down", extra=fields(signal=received))
    stopping = asyncio.ensure_future(shut_down(server, config.shutdown))
    second = asyncio.ensure_future(signals.second())
    try:
        await asyncio.wait({stopping, second}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signals.close()
    if stopping.done():
        second.cancel()
        stopping.result()
        log.info("stopped")
        return 0
    stopping.cancel()
    log.warning("second signal received, exiting without finishing the shutdown")
    return 1


def run(config: Config) -> int:
    start_server_process()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(serve(config))
