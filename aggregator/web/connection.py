"""One client connection as every request on it sees it, whichever protocol carries it."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

# A connection's protocol, as Go's `Request.Proto` names it.
HTTP1 = "HTTP/1.1"
HTTP2 = "HTTP/2.0"


class Connection:
    """One client connection: the peer's address, its TLS session and the protocol it speaks
    (HTTP/1.1, or HTTP/2 when ALPN chose `h2`), read once when it opens.

    `presented` is authentication's memo of what the peer's certificate chain said
    (`auth/authn.py`), kept for as long as the connection lives: every stream of an HTTP/2
    connection is the same caller.
    """

    __slots__ = ("presented", "protocol", "remote", "ssl_object")

    def __init__(self, remote: str | None, ssl_object: ssl.SSLObject | None, protocol: str = HTTP1) -> None:
        self.remote = remote
        self.ssl_object = ssl_object
        self.protocol = protocol
        self.presented: Any = None

    @classmethod
    def of_transport(cls, transport: asyncio.BaseTransport, protocol: str = HTTP1) -> Connection:
        """A new client connection (what the server records once per connection)."""
        peer = transport.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple | list) and peer else (str(peer) if peer else None)
        return cls(remote, transport.get_extra_info("ssl_object"), protocol)
