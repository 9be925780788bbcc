"""metav1.Status: the error shape every Kubernetes client expects.

Field order follows the Go struct (kind, apiVersion, metadata, status, message, reason, details, code).
"""

from __future__ import annotations

from typing import Any

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
