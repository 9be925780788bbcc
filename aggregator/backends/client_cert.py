"""The front-proxy client certificate shown to backends (and to kube-apiserver as the front proxy).

`--proxy-client-cert-file`/`--proxy-client-key-file`, re-read when the files change: listeners
(the backend registry, the delegate) rebuild their TLS contexts for new connections, and
connections already open keep the certificate they were made with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aggregator.tls.pem import CertKeyPair, PEMError, read_pair
from aggregator.util.filewatch import PollingWatcher, stat_fingerprint
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


class ProxyClientCertificate:
    """`--proxy-client-cert-file`/`--proxy-client-key-file`, re-read when the files change.

    A half-written or mismatched pair is refused and the previous one stays in use.
    """

    def __init__(self, cert_file: str | None, key_file: str | None, *, interval: float = 1.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.generation = 0
        self._listeners: list[Callable[[], None]] = []
        self._watcher: PollingWatcher | None = None
        if cert_file and key_file:
            self._watcher = PollingWatcher(  # before the read: see PollingWatcher's baseline
                lambda: stat_fingerprint([cert_file, key_file]),
                self.reload,
                interval=interval,
                name="proxy-client-cert-reload",
            )
        self.pair: CertKeyPair | None = read_pair(cert_file, key_file) if cert_file and key_file else None

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def reload(self) -> None:
        if not (self.cert_file and self.key_file):
            return
        try:
            pair = read_pair(self.cert_file, self.key_file)
        except PEMError as err:
            log.warning(
                "proxy client certificate not reloaded, still presenting the previous one",
                extra=fields(cert_file=self.cert_file, reason=str(err)),
            )
            return
        if pair.same_as(self.pair):
            return
        self.pair = pair
        self.generation += 1
        log.info("proxy client certificate reloaded", extra=fields(cert_file=self.cert_file, **pair.described()))
        for listener in self._listeners:
            listener()

    async def start(self) -> None:
        if self._watcher is not None:
            self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
