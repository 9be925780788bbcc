"""The CA files named by flags (`--client-ca-file`, `--requestheader-client-ca-file`), re-read on change."""

from __future__ import annotations

from aggregator.auth.options import AuthenticationOptions
from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.tls.verify import CAFile, CAPool


class CAFiles:
    """The CA files named by flags, re-read on change; a Gateway component."""

    def __init__(self, options: AuthenticationOptions) -> None:
        self.requestheader = options.requestheader
        self.client_ca = CAFile(options.client_ca_file) if options.client_ca_file else None
        self.requestheader_ca = (
            CAFile(options.requestheader.client_ca_file) if options.requestheader.client_ca_file else None
        )
        self._requestheader: RequestHeaderConfig | None = None

    def client_ca_pool(self) -> CAPool | None:
        return self.client_ca.pool if self.client_ca is not None else None

    def requestheader_config(self) -> RequestHeaderConfig | None:
        """The front-proxy settings, rebuilt only when the CA file was re-read."""
        if self.requestheader_ca is None:
            return None
        pool = self.requestheader_ca.pool
        if self._requestheader is None or self._requestheader.pool is not pool:
            self._requestheader = self.requestheader.config(pool)
        return self._requestheader

    async def start(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                ca.start()

    async def stop(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                await ca.stop()
