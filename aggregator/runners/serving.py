"""What a gateway process needs of serving without listening: the serving certificate (the control
process of `--workers N` generates it in --cert-dir before its workers load it, and reports its
expiry) and the bound on a graceful shutdown.

Apart from `server.py`, so that control process loads neither aiohttp's server nor the HTTP/2
listener (about 2 MiB resident in each process that imports them).
"""

from __future__ import annotations

import logging
import socket

from aggregator.config import Config
from aggregator.tls.options import ServingConfig
from aggregator.tls.pem import PEMError
from aggregator.tls.serving import ServingCertificate, resolve_serving_files
from aggregator.util.flags import ConfigError
from aggregator.util.logs import fields
from aggregator.web.alpn import alpn_protocols
from aggregator.web.options import ShutdownConfig

log = logging.getLogger(__name__)

# What outlives its drain bound is cut: aiohttp's RequestHandler.shutdown waits this long for a
# handler, cancels it, and waits as long again.
CLOSE_TIMEOUT = 1.0


def _serving_hosts(serving: ServingConfig) -> list[str]:
    hosts = [socket.gethostname()]
    if serving.bind_address not in ("0.0.0.0", "::"):
        hosts.append(serving.bind_address)
    return hosts


def serving_certificate(config: Config, *, http2: bool = True) -> ServingCertificate:
    """The serving pair the flags name (or one generated in --cert-dir), hot-reloaded once
    started, asking for client certificates of the CAs authentication trusts."""
    serving = config.serving
    cert_file, key_file, generated = resolve_serving_files(
        serving.cert_file, serving.key_file, serving.cert_dir, _serving_hosts(serving)
    )
    if generated:
        log.info("generated a self-signed serving certificate", extra=fields(cert_file=cert_file))
    try:
        return ServingCertificate(
            cert_file,
            key_file,
            client_ca_files=config.authentication.client_ca_files(),
            policy=serving.tls_policy,
            alpn=alpn_protocols(http2 and serving.http2),
        )
    except PEMError as err:
        flag = "--tls-cert-file" if serving.cert_file else "--cert-dir"
        raise ConfigError(flag, str(err)) from err


def shutdown_bound(shutdown: ShutdownConfig) -> float:
    """The longest `shut_down` takes, before the components stop (a second or so): what a
    Deployment's terminationGracePeriodSeconds must exceed."""
    return shutdown.delay + shutdown.drain + 2 * CLOSE_TIMEOUT
