"""apimachinery's `errors.New*` constructors: the Status bodies clients parse, with upstream wording."""

from __future__ import annotations

from typing import Any

from aggregator.model.fielderrors import go_quote
from aggregator.model.status import status_body
from sample_apiserver.api import GROUP, FieldError, ResourceType


class APIError(Exception):
    """Raised anywhere in a request; the server turns it into the Status response."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.details = details

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.message, reason=self.reason, details=self.details)


def _details(resource: ResourceType, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    details["group"] = GROUP
    details["kind"] = resource.plural
    details.update(extra)
    return details


def not_found(resource: ResourceType, name: str) -> APIError:
    return APIError(404, f"{resource.qualified} {go_quote(name)} not found", details=_details(resource, name))


def already_exists(resource: ResourceType, name: str) -> APIError:
    return APIError(
        409,
        f"{resource.qualified} {go_quote(name)} already exists",
        reason="AlreadyExists",
        details=_details(resource, name),
    )


def conflict(resource: ResourceType, name: str, cause: str) -> APIError:
    return APIError(
        409,
        f"Operation cannot be fulfilled on {resource.qualified} {go_quote(name)}: {cause}",
        reason="Conflict",
        details=_details(resource, name),
    )


OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(resource: ResourceType, name: str, errors: list[FieldError]) -> APIError:
    """`NewInvalid(GroupKind, name, errs)`: 422 with one cause per field error."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    causes = [{"reason": e.reason, "message": e.body, "field": e.path} for e in errors]
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    details["group"] = GROUP
    details["kind"] = resource.kind
    details["causes"] = causes
    return APIError(422, f"{resource.kind}.{GROUP} {go_quote(name)} is invalid: {listed}", details=details)


def bad_request(message: str) -> APIError:
    return APIError(400, message)


def method_not_allowed(resource: ResourceType, verb: str) -> APIError:
    """Upstream: a verb the resource's storage does not implement (e.g. POST on a named path)."""
    return APIError(
        405,
        f"{verb} is not supported on resources of kind {go_quote(resource.plural + '.' + GROUP)}",
        reason="MethodNotAllowed",
        details=_details(resource, ""),
    )


def forbidden_admission(resource: ResourceType, name: str, reason: str) -> APIError:
    """`NewForbidden(GroupResource, name, err)` as admission plugins return it."""
    return APIError(
        403,
        f"{resource.qualified} {go_quote(name)} is forbidden: {reason}",
        details=_details(resource, name),
    )
