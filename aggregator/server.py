"""The listener and the process runner: serve one gateway on its TLS port until told to stop.

`GatewayServer` loads the serving certificate (hot-reloaded), starts the gateway's components,
then listens with aiohttp's low-level server: the pipeline is the one handler, with no URL
dispatcher or middleware chain in front of the gateway's own router. `serve` runs it until SIGTERM
or SIGINT; `run` is what `aggregator serve` calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from aiohttp import web

from aggregator import __version__
from aggregator.assembly import Gateway, WorkerGateway, build_gateway
from aggregator.config import ConfigError, Options, tls_policy
from aggregator.tls.pem import PEMError
from aggregator.tls.serving import ServingCertificate, resolve_serving_files
from aggregator.util._aiohttp import GatewayRequest, TimedServer, TimedSite
from aggregator.util.logs import fields
from aggregator.util.runtime import new_event_loop, wait_for_termination
from aggregator.web.certexpiry import SERVING

log = logging.getLogger(__name__)

# Request bodies the gateway reads itself (it streams everything it proxies).
CLIENT_MAX_SIZE = 3 * 1024 * 1024
LISTEN_BACKLOG = 1024
# kube-apiserver's http.Server (k8s.io/apiserver pkg/server/secure_serving.go, no flags): a request
# head must arrive within 32 s ("just shy of requestTimeoutUpperBound"), and a connection with no
# request in flight is closed after 90 s ("matches http.DefaultTransport keep-alive timeout").
READ_HEADER_TIMEOUT = 32.0
IDLE_TIMEOUT = 90.0


def _serving_hosts(options: Options) -> list[str]:
    hosts = [socket.gethostname()]
    if options.bind_address not in ("0.0.0.0", "::"):
        hosts.append(options.bind_address)
    return hosts


def serving_certificate(options: Options) -> ServingCertificate:
    """The serving pair the flags name (or one generated in --cert-dir), hot-reloaded once started."""
    cert_file, key_file, generated = resolve_serving_files(
        options.tls_cert_file, options.tls_private_key_file, options.cert_dir, _serving_hosts(options)
    )
    if generated:
        log.info("generated a self-signed serving certificate", extra=fields(cert_file=cert_file))
    client_cas = [f for f in (options.client_ca_file, options.requestheader_client_ca_file) if f]
    try:
        return ServingCertificate(cert_file, key_file, client_ca_files=client_cas, policy=tls_policy(options))
    except PEMError as err:
        flag = "--tls-cert-file" if options.tls_cert_file else "--cert-dir"
        raise ConfigError(flag, str(err)) from err


class GatewayServer:
    """A gateway listening on its TLS port: what `serve` runs, and what tests start in-process."""

    def __init__(
        self, options: Options, gateway: Gateway | WorkerGateway | None = None, *, reuse_port: bool = False
    ) -> None:
        self.options = options
        self.serving = serving_certificate(options)
        self.gateway = gateway or build_gateway(options)
        self.gateway.metrics.certificate_expiry.follow(
            SERVING, lambda: (self.serving.cert_file, [self.serving.current.leaf])
        )
        # `--workers N`: every worker listens on the same port; the kernel spreads connections.
        self.reuse_port = reuse_port
        self.read_header_timeout = READ_HEADER_TIMEOUT
        self.idle_timeout = IDLE_TIMEOUT
        self.port = 0
        self._runner: web.ServerRunner | None = None

    @property
    def url(self) -> str:
        host = self.options.bind_address
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return f"https://{host}:{self.port}"

    def _low_level_server(self) -> web.Server:
        loop = asyncio.get_running_loop()

        def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.Request:
            return GatewayRequest(
                message, payload, protocol, writer, task, loop, client_max_size=CLIENT_MAX_SIZE
            )

        return TimedServer(
            self.gateway.pipeline.handle,
            read_header_timeout=self.read_header_timeout,
            request_factory=make_request,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self.idle_timeout,
            max_line_size=65536,
            max_field_size=65536,
        )

    async def start(self) -> int:
        await self.gateway.start()
        self._runner = web.ServerRunner(self._low_level_server())
        await self._runner.setup()
        site = TimedSite(
            self._runner,
            self.options.bind_address,
            self.options.secure_port,
            ssl_context=self.serving.context,
            backlog=LISTEN_BACKLOG,
            reuse_port=self.reuse_port or None,
            ssl_handshake_timeout=self.read_header_timeout,  # Go's tlsHandshakeTimeout
        )
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            await self.gateway.stop()
            address = f"{self.options.bind_address}:{self.options.secure_port}"
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise ConfigError("--secure-port", f"cannot listen on {address}: {reason}") from err
        self.serving.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.options.secure_port
        log.info(
            "serving",
            extra=fields(
                mode="local" if self.options.local_mode else "kube",
                address=f"https://{self.options.bind_address}:{self.port}",
                objects=self.options.apiservices_dir or self.options.kubeconfig or "in-cluster",
                auth=", ".join(self.gateway.auth_summary) or "none configured",
                version=__version__,
            ),
        )
        return self.port

    async def stop(self) -> None:
        self.gateway.shutting_down = True
        await self.serving.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.gateway.stop()


async def serve(options: Options) -> int:
    """Run until SIGTERM or SIGINT; returns the process exit code."""
    server = GatewayServer(options)
    await server.start()
    await wait_for_termination()
    log.info("shutting down")
    server.gateway.shutting_down = True
    if options.shutdown_delay_duration > 0:
        await asyncio.sleep(options.shutdown_delay_duration)
    await server.stop()
    return 0


def run(options: Options) -> int:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(serve(options))
