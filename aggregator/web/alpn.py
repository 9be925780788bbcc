"""What the serving TLS context offers through ALPN (kube-apiserver's `NextProtos`).

Apart from the listener that dispatches on it (`web/http2/listener.py`), so a process that holds
a serving certificate but never listens (the control process of `--workers N`) loads no server.
"""

from __future__ import annotations

H2 = "h2"
HTTP11 = "http/1.1"


def alpn_protocols(http2: bool) -> tuple[str, ...]:
    """What the TLS context offers (secure_serving.go `tlsConfig`)."""
    return (H2, HTTP11) if http2 else (HTTP11,)
