"""`join_host_port` writes addresses as Go's `net.JoinHostPort` does (endpoint labels, dial errors)."""

from __future__ import annotations

import pytest

from aggregator.util.hostport import join_host_port


@pytest.mark.parametrize(
    ("host", "port", "joined"),
    [
        ("10.0.0.1", 443, "10.0.0.1:443"),
        ("fd00::1", 443, "[fd00::1]:443"),
        ("::ffff:10.0.0.1", "8443", "[::ffff:10.0.0.1]:8443"),
        ("api.example.svc", 6443, "api.example.svc:6443"),
    ],
)
def test_brackets_only_ipv6(host: str, port: int | str, joined: str) -> None:
    assert join_host_port(host, port) == joined
