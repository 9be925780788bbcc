"""The CA files named by flags (`--client-ca-file`, `--requestheader-client-ca-file`), re-read on change."""

from __future__ import annotations

from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.config import Options
from aggregator.tls.verify import CAFile, CAPool


class CAFiles:
    """The CA files named by flags, re-read on change; a Gateway component."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.client_ca = CAFile(options.client_ca_file) if options.client_ca_file else None
        self.requestheader_ca = (
            CAFile(options.requestheader_client_ca_file) if options.requestheader_client_ca_file else None
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
            opts = self.options
            self._requestheader = RequestHeaderConfig(
                pool=pool,
                allowed_names=frozenset(opts.requestheader_allowed_names),
                username_headers=tuple(opts.requestheader_username_headers),
                uid_headers=tuple(opts.requestheader_uid_headers),
                group_headers=tuple(opts.requestheader_group_headers),
                extra_prefixes=tuple(opts.requestheader_extra_headers_prefix),
            )
        return self._requestheader

    async def start(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                ca.start()

    async def stop(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                await ca.stop()
