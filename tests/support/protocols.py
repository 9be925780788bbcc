"""Which protocol each request reached an in-process gateway over, and from which client.

`RequestLog.attach(server)` adds a finisher to the gateway's pipeline (as `apiserver_request_*`
and the access log are fed): every request's protocol (`HTTP/1.1`, `HTTP/2.0`), User-Agent and
whether it was an upgrade. The end-to-end stacks attach one, and their kubectl runner asserts after
every call that kubectl's requests came over the protocol the gateway should have negotiated with
it (HTTP/2 unless `disable_http2_serving`), upgrades aside (they are HTTP/1.1 by RFC 9113).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from aggregator.server import GatewayServer
from aggregator.web.context import HTTP1, HTTP2, RequestContext


@dataclass(frozen=True)
class Seen:
    protocol: str
    user_agent: str
    upgrade: bool
    method: str
    path: str


@dataclass
class RequestLog:
    seen: list[Seen] = field(default_factory=list)
    expected: str = HTTP2
    checked: int = 0  # kubectl requests whose protocol was checked
    calls: int = 0  # kubectl runs that checked

    def attach(self, server: GatewayServer) -> RequestLog:
        self.expected = HTTP1 if server.options.serving.disable_http2_serving else HTTP2
        server.gateway.pipeline.finishers.append(self._finished)
        return self

    def _finished(self, ctx: RequestContext, _response: web.StreamResponse | None, _error: Any) -> None:
        self.seen.append(
            Seen(
                ctx.connection.protocol, ctx.headers.get("User-Agent", ""), ctx.upgrade, ctx.method, ctx.path
            )
        )

    def mark(self) -> int:
        return len(self.seen)

    def check_kubectl(self, since: int, args: tuple[str, ...]) -> None:
        """kubectl's requests since `since` came over the expected protocol."""
        requests = [s for s in self.seen[since:] if s.user_agent.startswith("kubectl") and not s.upgrade]
        wrong = [f"{s.method} {s.path} over {s.protocol}" for s in requests if s.protocol != self.expected]
        assert not wrong, f"kubectl {' '.join(args)}: expected {self.expected}, got {wrong}"
        self.checked += len(requests)
        self.calls += 1

    def verify_seen(self) -> None:
        """kubectl ran and its requests were seen at all (the check above did check something)."""
        assert not self.calls or self.checked, "kubectl ran, but no request of its reached the gateway"
