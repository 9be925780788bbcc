"""Which protocol each request reached an in-process gateway over, and from which client.

`RequestLog.attach(gateway)`, before a server serves the gateway, records every request the
protocols hand its pipeline (`Pipeline.handle`): the protocol (`HTTP/1.1`, `HTTP/2.0`), User-Agent
and whether it was an upgrade. The end-to-end stacks attach one, and their kubectl runner asserts after
every call that kubectl's requests came over the protocol the gateway should have negotiated with
it (HTTP/2 unless `disable_http2_serving`), upgrades aside (they are HTTP/1.1 by RFC 9113).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregator.assembly import Gateway
from aggregator.runners.server import GatewayServer
from aggregator.web.context import HTTP1, HTTP2, is_upgrade_request
from aggregator.web.serverrequest import ServerRequest


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

    def attach(self, gateway: Gateway) -> RequestLog:
        """Record what reaches `gateway`'s pipeline (call before a server is built around it)."""
        handle = gateway.pipeline.handle

        async def observed(request: ServerRequest) -> Any:
            headers = request.headers
            self.seen.append(
                Seen(
                    request.connection.protocol,
                    headers.get("User-Agent", ""),
                    is_upgrade_request(headers),
                    request.method,
                    request.raw_path,
                )
            )
            return await handle(request)

        gateway.pipeline.handle = observed  # type: ignore[method-assign]
        return self

    def expect(self, server: GatewayServer) -> None:
        """kubectl's requests come over HTTP/2 when the server offers it."""
        self.expected = HTTP2 if server.http2 is not None else HTTP1

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
