"""Where one proxied request goes and how: the address, TLS, and how identity is asserted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aggregator.backends.backend import Address, Backend
from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.util.hostport import join_host_port


@dataclass(frozen=True, slots=True)
class Destination:
    """Where one request goes and how: the address to dial, TLS, and how identity is asserted."""

    name: str  # metrics and log label: the APIService name, or "delegate"
    backend: Backend  # TLS context and connection pool
    host: str  # what is dialed: a pinned IP for APIServices
    port: int
    server_name: str | None  # TLS verification name (None: the host)
    # Which inbound headers carry identity, read per request (front-proxy names may change live).
    identity: LiveIdentityPolicy
    base_path: str = ""  # the server URL's path (a kubeconfig server may have one)
    impersonate: bool = False  # identity as Impersonate-* (with `credentials`) instead of X-Remote-*
    credentials: Mapping[str, str] | None = None  # the gateway's own Authorization, when impersonating
    # kube-apiserver's own redirects (e.g. service proxy paths) are passed on; a backend's never are.
    pass_redirects: bool = False
    hop: str | None = None  # this gateway's loop mark (`backends/hops.py`)

    # `host:port` (an IPv6 host in brackets): read by every proxied request, so made once.
    authority: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "authority", join_host_port(self.host, self.port))

    @property
    def address(self) -> Address:
        return Address(self.host, self.port, self.server_name)

    @property
    def base_url(self) -> str:
        return f"https://{self.authority}{self.base_path}"
