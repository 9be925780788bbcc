"""Wire authentication (and, later, authorization) into a Gateway from its options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.auth.authn import Authenticator
from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.config import Options
from aggregator.tls.verify import CAFile, CAPool

if TYPE_CHECKING:
    from aggregator.server import Gateway


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


def install_authentication(gateway: Gateway) -> Authenticator:
    options = gateway.options
    files = CAFiles(options)
    gateway.add_component(files)
    authenticator = Authenticator(
        anonymous=options.anonymous_auth,
        client_ca=files.client_ca_pool,
        requestheader=files.requestheader_config,
    )
    gateway.authenticator = authenticator
    gateway.gates.append(authenticator.gate)
    if files.requestheader_ca is not None:
        names = ",".join(options.requestheader_allowed_names) or "any name"
        gateway.auth_summary.append(
            f"front-proxy headers (CA {options.requestheader_client_ca_file}, CN {names})"
        )
    if files.client_ca is not None:
        gateway.auth_summary.append(f"client certificates (CA {options.client_ca_file})")
    gateway.auth_summary.append("anonymous" if options.anonymous_auth else "anonymous only on health paths")
    return authenticator
