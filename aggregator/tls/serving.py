"""The gateway's serving certificate, re-read when its files change.

The listener's context has an `sni_callback` (OpenSSL calls it for every handshake, with or without
SNI) that hands each new connection the context of the current pair. A reload builds a fresh context
and swaps the reference: new handshakes present the new certificate, established connections keep
going, no restart. (Loading into the live context instead would keep the old certificate around
when the key type changes, because OpenSSL holds one certificate per key type.) A half-written or
mismatched pair is rejected before anything is swapped, so the old one keeps serving and the log
says why. Every context, the listener's and each reloaded pair's, is built by `new_server_context` with
the same `TLSPolicy`, so a reload never loosens the minimum version or the cipher list.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from pathlib import Path

from aggregator.tls.issue import self_signed_serving_pair
from aggregator.tls.peer import request_client_certificates
from aggregator.tls.pem import CertKeyPair, PEMError, load_pair_into, read_pair
from aggregator.tls.policy import DEFAULT_POLICY, TLSPolicy
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


def new_server_context(
    policy: TLSPolicy = DEFAULT_POLICY, alpn: Sequence[str] = ("http/1.1",)
) -> ssl.SSLContext:
    """`policy`'s versions and suites (default TLS >= 1.2), and the application protocols offered
    with ALPN (HTTP/1.1 only by default, advertised so HTTP/2 clients fall back cleanly)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    policy.apply(ctx)
    ctx.set_alpn_protocols(list(alpn))
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


class ServingCertificate:
    """Owns the listener's SSLContext and keeps it in step with the certificate files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca_files: list[str],
        policy: TLSPolicy = DEFAULT_POLICY,
        alpn: Sequence[str] = ("http/1.1",),
        interval: float = 1.0,
    ):
        self.cert_file = cert_file
        self.key_file = key_file
        self._client_ca_files = client_ca_files
        self.policy = policy
        # Every context offers the same protocols: after a reload, ALPN is chosen by the new one.
        self.alpn = tuple(alpn)
        self._watcher = PollingWatcher(  # before the read: see PollingWatcher's baseline
            lambda: stat_fingerprint([cert_file, key_file]),
            self.reload,
            interval=interval,
            name="serving-cert-reload",
        )
        self.current: CertKeyPair = read_pair(cert_file, key_file)  # raises PEMError at start-up
        self.context = self._context_for(self.current)
        for line in policy.startup_warnings(self.context.security_level):
            log.warning(line)
        self.verifies_in_app = request_client_certificates(self.context, lambda: client_ca_files)
        self._pair_context = self.context
        self.context.sni_callback = self._select_context
        self.last_error: str | None = None

    def _context_for(self, pair: CertKeyPair) -> ssl.SSLContext:
        ctx = new_server_context(self.policy, self.alpn)
        load_pair_into(ctx, pair)
        return ctx

    def _select_context(self, sslobj: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        if self._pair_context is not self.context:
            sslobj.context = self._pair_context

    def reload(self) -> None:
        """Re-read both files; swap the pair in only when it is complete and consistent."""
        try:
            pair = read_pair(self.cert_file, self.key_file)
            if pair.same_as(self.current):
                return
            pair_context = self._context_for(pair)
            request_client_certificates(pair_context, lambda: self._client_ca_files)
        except (PEMError, ssl.SSLError) as err:
            self.last_error = str(err)
            log.warning(
                "serving certificate not reloaded, still serving the previous one",
                extra=fields(cert_file=self.cert_file, reason=str(err)),
            )
            return
        self.current = pair
        self._pair_context = pair_context
        self.last_error = None
        log.info("serving certificate reloaded", extra=fields(cert_file=self.cert_file, **pair.described()))

    def start(self) -> None:
        self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()


def resolve_serving_files(
    tls_cert_file: str | None, tls_private_key_file: str | None, cert_dir: str, hosts: list[str]
) -> tuple[str, str, bool]:
    """The pair to serve, generating a self-signed one in `cert_dir` when none is given.

    Returns (cert, key, generated): false when a pair generated earlier is reused.
    """
    if tls_cert_file and tls_private_key_file:
        return tls_cert_file, tls_private_key_file, False
    cert, key, generated = self_signed_serving_pair(Path(cert_dir), hosts)
    return str(cert), str(key), generated
