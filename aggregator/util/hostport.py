"""`host:port` as Go's `net.JoinHostPort` writes it: an IPv6 address in brackets.

Endpoint labels, log fields, error messages (`dial tcp [fd00::1]:443: ...`) and URLs must all
write an address the way kube-aggregator's do, so every place that names one calls this.
"""

from __future__ import annotations


def join_host_port(host: str, port: int | str) -> str:
    """`net.JoinHostPort(host, port)`: `[host]:port` when the host has a colon (IPv6), else `host:port`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
