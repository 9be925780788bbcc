"""metav1.Status: the error shape every Kubernetes client expects.

Field order follows the Go struct (kind, apiVersion, metadata, status, message, reason, details, code).
"""

from __future__ import annotations

from typing import Any

from aggregator.model.fielderrors import go_quote

# HTTP code -> metav1.StatusReason, as apimachinery's errors package pairs them.
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

NOT_FOUND_MESSAGE = "the server could not find the requested resource"


def status_body(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A failure Status as an ordered dict ready for `go_marshal`."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    }
    chosen = REASONS.get(code, "") if reason is None else reason
    if chosen:
        body["reason"] = chosen
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def forbidden_message(
    user: str,
    verb: str,
    *,
    resource: str = "",
    subresource: str = "",
    group: str = "",
    name: str = "",
    namespace: str = "",
    path: str = "",
    reason: str = "",
) -> str:
    """The message of upstream's 403 (`responsewriters.forbiddenMessage` + `NewForbidden`).

    Resource requests: `<resource>.<group> "<name>" is forbidden: User "<u>" cannot <verb> resource
    "<res>[/<sub>]" in API group "<g>" in the namespace "<ns>"` (or `at the cluster scope`);
    non-resource requests: `forbidden: User "<u>" cannot <verb> path "<path>"`. A non-empty
    authorizer reason is appended after `: `.
    """
    q = go_quote
    if not resource:
        detail = f"User {q(user)} cannot {verb} path {q(path)}"
    else:
        full = f"{resource}/{subresource}" if subresource else resource
        scope = f"in the namespace {q(namespace)}" if namespace else "at the cluster scope"
        detail = f"User {q(user)} cannot {verb} resource {q(full)} in API group {q(group)} {scope}"
    if reason:
        detail = f"{detail}: {reason}"
    if not resource and not group:
        return f"forbidden: {detail}"
    qualified = f"{resource}.{group}" if group else resource
    return f"{qualified} {q(name)} is forbidden: {detail}" if name else f"{qualified} is forbidden: {detail}"


def forbidden_details(resource: str, group: str, name: str) -> dict[str, str]:
    """`details` of a 403 Status: name, group, kind (the resource), omitting empty fields.

    Always include it, even empty: upstream's non-resource 403 carries `"details":{}`.
    """
    details = {"name": name, "group": group, "kind": resource}
    return {k: v for k, v in details.items() if v}
