"""The gate that closes proxy loops: a request carrying a gateway's hop mark is refused with 508.

See `backends/hops.py` for the mark. The refusal comes before authentication: a looped request
costs no review, and the gateway that forwarded it relays the 508 to its client (or, for its own
availability probe, records `ProxyLoop`).
"""

from __future__ import annotations

import logging

from aggregator.backends.hops import HOP_HEADER, LOOP_REASON, LOOP_STATUS, loop_message
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.pipeline import Gate
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Response

log = logging.getLogger(__name__)


def loop_gate(instance: str) -> Gate:
    """A pipeline gate refusing requests another gateway (or this one) already forwarded."""

    def refuse_loops(ctx: RequestContext) -> Response | None:
        seen = ctx.headers.get(HOP_HEADER)
        if seen is None:
            return None
        message = loop_message(seen, instance)
        log.warning(
            "refused a request another aggregator gateway forwarded: a proxy loop",
            extra=fields(method=ctx.method, path=ctx.path, forwarded_by=seen[:100], remote=ctx.remote),
        )
        return status_response(ctx, LOOP_STATUS, message, reason=LOOP_REASON)

    return refuse_loops
