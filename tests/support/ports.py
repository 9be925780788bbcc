"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

# Linux's default ephemeral range starts at 32768; ports are drawn from below it.
_LOWEST = 15000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _first_ephemeral() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port(hosts: Sequence[str] = ("127.0.0.1",)) -> int:
    """A port nothing listens on right now on any of `hosts`, for a server that needs its number
    before it starts (a subprocess given `--secure-port`, a Service's port in a manifest).

    Drawn at random from below the kernel's ephemeral range: `bind(0)` and every outgoing
    connection take their ports from that range, so while the server is still starting, a client
    socket of another test (or of another `make test` worker) cannot take the port from it, and
    two workers drawing at random rarely pick the same one (the bind check catches one already
    bound). Where the range is unknown, the kernel picks (`bind(0)`).
    """
    ephemeral = _first_ephemeral()
    for _ in range(200):
        port = random.randrange(_LOWEST, ephemeral) if ephemeral > _LOWEST + 1000 else 0
        try:
            return _bindable(hosts, port)
        except OSError:
            continue
    raise AssertionError(f"no port free on {', '.join(hosts)}")


def _bindable(hosts: Sequence[str], port: int) -> int:
    """`port` (or, for 0, the one the kernel picks) if it binds on every host; OSError if not."""
    with socket.socket() as first:
        first.bind((hosts[0], port))
        port = int(first.getsockname()[1])
        for host in hosts[1:]:
            with socket.socket() as other:
                other.bind((host, port))
    return port
