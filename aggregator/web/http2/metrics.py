"""What the listener counts about connections: which protocol each negotiated, and why HTTP/2
connections were sent away.

kube-apiserver has no such metric (Go's server counts nothing per protocol); the gateway's own
names carry the `aggregator_` prefix. The request metrics (`apiserver_request_*`, the access log,
audit) are the same for both protocols: they are written by the one pipeline.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aggregator.web.metrics import Children, Families

# Why a GOAWAY was sent, the `reason` label (documented in docs/reference.md).
GOAWAY_REASONS = (
    "shutdown",
    "idle",
    "connection_close",
    "unauthenticated",
    "client_goaway",
    "rapid_reset",
    "reset_flood",
    "header_block",
    "continuation_flood",
    "header_list",
    "settings",
    "control_flood",
    "control_queue",
    "empty_frames",
    "protocol_error",
)


class ConnectionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.connections = family.counter(
            "aggregator_connections",
            "Client connections accepted, by the protocol TLS negotiated with ALPN (h2, http/1.1).",
            ["protocol"],
        )
        self.goaways = family.counter(
            "aggregator_http2_goaways",
            "GOAWAY frames sent on HTTP/2 connections, by reason: shutdown, idle, connection_close, "
            "unauthenticated and client_goaway end a connection gracefully; the others are defences "
            "(rapid_reset, reset_flood, header_block, continuation_flood, settings, "
            "control_flood, control_queue, empty_frames) and protocol_error.",
            ["reason"],
        )
        self._connections = Children(self.connections)
        self._goaways = Children(self.goaways)

    def accepted(self, protocol: str) -> None:
        self._connections(protocol).inc()

    def goaway(self, reason: str) -> None:
        self._goaways(reason).inc()


class PenaltyMetrics:
    """The gateway's own counter (kube-apiserver has no penalty, so no metric to match)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Families(registry).counter(
            "aggregator_http2_penalised_connections",
            "Connections from an address penalised for an HTTP/2 flood (a connection cut with GOAWAY "
            "ENHANCE_YOUR_CALM), by outcome: delayed (held unserved until the penalty ends) or "
            "refused (closed at once: too many held for that address).",
            ["outcome"],
        )
        self._connections = Children(self.connections)

    def penalised(self, outcome: str) -> None:
        self._connections(outcome).inc()
