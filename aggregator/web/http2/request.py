"""The aiohttp request of an HTTP/2 stream, and the answers after which its connection ends.

kube-apiserver ends an HTTP/2 connection after its response (Go's server reads a response's
`Connection: close` as "send GOAWAY, finish what is in flight, close") in three cases:

- the handler asked for it (aiohttp's `force_close`, or a `Connection: close` header): the
  gateway's refusals during shutdown;
- the request failed authentication: filters/authentication.go `Unauthorized`, behind the
  `UnauthenticatedHTTP2DOSMitigation` feature gate (on by default);
- the request was served as an anonymous user (`isAnonymousUser`: the name `system:anonymous`
  or the group `system:unauthenticated`), the same gate: "limit this connection to just this
  request" (CVE-2023-44487, CVE-2023-39325).

A 401 relayed from a backend is the backend's answer, not the gateway's refusal: it leaves the
connection open, as upstream's proxy does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aggregator.model.userinfo import ANONYMOUS_USER, UNAUTHENTICATED_GROUP, UserInfo
from aggregator.util._aiohttp import GatewayRequest
from aggregator.web.context import RequestContext


def is_anonymous(user: UserInfo) -> bool:
    """filters/authentication.go `isAnonymousUser`."""
    return user.name == ANONYMOUS_USER or UNAUTHENTICATED_GROUP in user.groups


def unauthenticated(ctx: RequestContext, status: int) -> bool:
    """UnauthenticatedHTTP2DOSMitigation: the gateway refused the caller's credentials, or served
    it as anonymous (the authenticated user, before any impersonation)."""
    if status == 401 and not ctx.handled:
        return True
    user = ctx.requester or ctx.user
    return user is not None and is_anonymous(user)


class H2Request(GatewayRequest):
    """A GatewayRequest whose response may end its connection (see the module docstring)."""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        await super()._prepare_hook(response)
        stream: Any = self.protocol
        ctx = self.gateway_context
        if response.keep_alive is False:
            stream.connection.shut_down("connection_close")
        elif isinstance(ctx, RequestContext) and unauthenticated(ctx, response.status):
            stream.connection.shut_down("unauthenticated")
