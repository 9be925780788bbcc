"""The hop mark that stops proxy loops: at most one aggregator gateway on the way to a backend.

An APIService whose backend is a gateway (this one, a replica behind the same Service, or another
gateway pointing back) would have each request forwarded again and again. Every request a gateway
sends towards a backend or kube-apiserver (proxied, tunnelled, discovery, OpenAPI, the
availability probe) carries `X-Aggregator-Hop: <instance>`, and a gateway refuses any request that
arrives with one: `508 Loop Detected`, before authentication, so a loop costs exactly one extra
request whoever closes it, and the availability check, whose own GET meets the same refusal,
records `ProxyLoop` (KEP-4020: "ensure at most one proxy"). kube-apiserver's proxy passes the
header on, so a loop through kube-apiserver's own aggregator stops the same way.

Chaining gateways on purpose (a gateway as another gateway's backend) is refused too: the mark
cannot tell a chain from a loop. A client that sends the header itself only refuses itself.
"""

from __future__ import annotations

import secrets
import socket

HOP_HEADER = "X-Aggregator-Hop"
LOOP_STATUS = 508
LOOP_REASON = "LoopDetected"  # the 508 Status's reason
PROXY_LOOP = "ProxyLoop"  # the Available condition's reason for an APIService served by a gateway
_PRINTABLE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._:")


def new_instance() -> str:
    """This gateway's mark: its host name (the pod's name) and a random suffix, so replicas and
    restarts are told apart in the 508's message."""
    host = "".join(c for c in socket.gethostname() if c in _PRINTABLE)[:63] or "gateway"
    return f"{host}-{secrets.token_hex(4)}"


def loop_message(seen: str, own: str) -> str:
    """Why a marked request is refused, naming the gateway that forwarded it."""
    if seen == own:
        who = "this gateway"
    elif seen and len(seen) <= 100 and set(seen) <= _PRINTABLE:
        who = f"aggregator gateway {seen}"
    else:
        who = "an aggregator gateway"
    return (
        f"proxy loop detected: this request was already forwarded by {who} ({HOP_HEADER}); an "
        "APIService must not be served by an aggregator gateway"
    )
