"""A throwaway PKI per test session, written by the same code as `aggregator certs init`."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from aggregator.commands.certs import init_pki
from aggregator.tls.issue import KeyPair, issue_client_cert, load_pair, write_pair


@dataclass(frozen=True)
class PKI:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def ca(self) -> KeyPair:
        return load_pair(self.dir, "ca")

    @property
    def client_ca(self) -> KeyPair:
        return load_pair(self.dir, "client-ca")

    @property
    def front_proxy_ca(self) -> KeyPair:
        return load_pair(self.dir, "front-proxy-ca")

    def client_context(self, cert: str | None = "admin") -> ssl.SSLContext:
        """Trusts the serving CA; presents `<cert>.crt`/`<cert>.key` when given."""
        ctx = ssl.create_default_context(cafile=self.path("ca.crt"))
        if cert:
            ctx.load_cert_chain(self.path(f"{cert}.crt"), self.path(f"{cert}.key"))
        return ctx

    def issue_user(self, stem: str, user: str, groups: tuple[str, ...] = (), *, ca: str = "client-ca") -> str:
        """Write `<stem>.crt`/`.key` for `user` signed by `ca`; returns the stem for client_context."""
        write_pair(self.dir, stem, issue_client_cert(load_pair(self.dir, ca), user, groups))
        return stem


def make_pki(directory: Path) -> PKI:
    init_pki(directory, hosts=["gateway.test"])
    return PKI(directory)
