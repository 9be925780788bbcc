"""Request paths a backend could read as another resource: refused with a 400 before anything else.

The gateway routes and authorizes a request by its path and sends that path to the backend byte
for byte. `/apis/a/v1/../../b/v1/secrets` is routed and authorized as group `a`, and a backend that
cleans paths (Go's `http.ServeMux`, most Python and Java frameworks) serves `/apis/b/v1/secrets`:
authorization and the backend no longer see the same resource. kube-apiserver does not clean paths
either (k/k#119269: `..` accepted as a namespace); since no Kubernetes name can be `.` or `..`
(`path.IsValidPathSegmentName`) nor empty, no client has a reason to send such a path, and it is
refused rather than normalized: normalizing would make the gateway one more parser that may
disagree with the backend's.

Refused, in the path as any server decodes it once (`%2e` is `.`, `%2F` is `/`, `%5C` is `\\`):
a `.` or `..` segment (also `..;x`, which Java servers read as `..`), and an empty segment (`//`)
anywhere but a trailing `/`. `\\` counts as a separator, as some servers treat it. Every route is
covered (aggregated APIs, the delegate to kube-apiserver, the gateway's own paths), before
authentication, so a refusal costs no review.
"""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlsplit

from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.responses import status_response
from aggregator.web.serverrequest import Response

log = logging.getLogger(__name__)


def path_problem(target: str) -> str | None:
    """Why the request target's path is refused, or None. `target` is as sent (origin or absolute form)."""
    path = target if target.startswith("/") else urlsplit(target).path
    path = path.split("?", 1)[0]
    if "/." not in path and "%" not in path and "//" not in path and "\\" not in path:
        return None  # the fast path: no segment can be a dot, empty or encoded one
    segments = unquote(path).replace("\\", "/").split("/")
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment.split(";", 1)[0] in (".", ".."):
            return f'it contains a "{segment}" segment'
        if not segment and 0 < index < last:
            return 'it contains an empty segment ("//")'
    return None


def refuse_confusing_paths(ctx: RequestContext) -> Response | None:
    """A pipeline gate: 400 for a path with a dot or empty segment, raw or percent-encoded."""
    problem = path_problem(ctx.target)
    if problem is None:
        return None
    shown = ctx.target[:1024]
    log.info("refused a request path", extra=fields(path=shown, reason=problem))
    return status_response(
        ctx,
        400,
        f'invalid request path "{shown}": {problem}; "." and ".." segments (raw or percent-encoded) '
        "and empty segments are not allowed",
    )
