"""The `Available` condition: upstream's reasons and messages, then the detail upstream leaves out.

kube-aggregator's messages are what operators search for and what alerts match on, so each one is
reproduced exactly (`remote_available_controller.go`). What they lack is the hop that failed, the
address dialed, the names a certificate holds, the HTTP status and body: that detail follows the
upstream message in brackets, `<upstream message> [hop: tls; dialed: 10.0.0.5:443; ...]`, so a
tool matching upstream's text still matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aggregator.backends import hops
from aggregator.model.apiservice import (
    AVAILABLE,
    LOCAL_MESSAGE,
    LOCAL_REASON,
    Condition,
    ServiceReference,
    now_rfc3339,
)
from aggregator.model.fielderrors import go_quote

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

PASSED = "Passed"
LOCAL = LOCAL_REASON
SERVICE_NOT_FOUND = "ServiceNotFound"
SERVICE_ACCESS_ERROR = "ServiceAccessError"
SERVICE_PORT_ERROR = "ServicePortError"
ENDPOINTS_ACCESS_ERROR = "EndpointsAccessError"
ENDPOINTS_NOT_FOUND = "EndpointsNotFound"
MISSING_ENDPOINTS = "MissingEndpoints"
FAILED_DISCOVERY_CHECK = "FailedDiscoveryCheck"
# Ours, not upstream's: failures of the discovery check that are a security refusal, not an outage,
# get their own reasons so alerts and `kubectl get apiservices` tell them apart.
FORBIDDEN_ENDPOINT = "ForbiddenEndpoint"  # the address is unspecified or in --backend-deny-cidrs
REDIRECT_REJECTED = "RedirectRejected"  # the backend answered with a redirect (CVE-2022-3172)
PROXY_LOOP = hops.PROXY_LOOP  # the backend is a gateway (this one, or another): a request loop
# Every reason the discovery GET can end in (a failed one is retried sooner than the interval).
DISCOVERY_CHECK_REASONS = frozenset(
    {FAILED_DISCOVERY_CHECK, FORBIDDEN_ENDPOINT, REDIRECT_REJECTED, PROXY_LOOP}
)
# The counter's reason when an APIService has no Available condition at all (upstream's word).
UNKNOWN_REASON = "UnknownReason"

PASSED_MESSAGE = "all checks passed"
BODY_EXCERPT = 300


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one check: an `Available` condition without its transition time."""

    status: str
    reason: str
    message: str

    @property
    def available(self) -> bool:
        return self.status == TRUE

    def held_by(self, conditions: tuple[Condition, ...]) -> bool:
        """These conditions already say this (status, reason and message): recording it again
        changes nothing, and needs no new condition or timestamp (a dead backend's every retry)."""
        for c in conditions:
            if c.type == AVAILABLE:
                return (c.status, c.reason, c.message) == (self.status, self.reason, self.message)
        return False

    def condition(self) -> Condition:
        """A condition stamped now; `set_condition` keeps the old time when the status is unchanged."""
        return Condition(AVAILABLE, self.status, now_rfc3339(), self.reason, self.message)


def with_detail(message: str, detail: Sequence[str]) -> str:
    """`message [a; b; c]`: upstream's text first, then ours."""
    items = [d for d in detail if d]
    return f"{message} [{'; '.join(items)}]" if items else message


def _service(ref: ServiceReference) -> str:
    # Go's %q of a namespace: namespaces are DNS labels, so plain double quotes are exact.
    return f'service/{ref.name} in "{ref.namespace}"'


def passed() -> Verdict:
    return Verdict(TRUE, PASSED, PASSED_MESSAGE)


def local() -> Verdict:
    return Verdict(TRUE, LOCAL, LOCAL_MESSAGE)


def _failed_at(hop: str, reason: str, message: str, detail: Sequence[str]) -> Verdict:
    """A hop that fails for certain: upstream's reason and message, then the hop and our detail."""
    return Verdict(FALSE, reason, with_detail(message, [f"hop: {hop}", *detail]))


def _cannot_check(hop: str, reason: str, ref: ServiceReference, err: str) -> Verdict:
    """Upstream's words when reading the Service or its endpoints fails: the answer is unknown."""
    return Verdict(UNKNOWN, reason, with_detail(f"{_service(ref)} cannot be checked due to: {err}", [f"hop: {hop}"]))


def service_not_found(ref: ServiceReference, detail: Sequence[str] = ()) -> Verdict:
    return _failed_at("service", SERVICE_NOT_FOUND, f"{_service(ref)} is not present", detail)


def service_access_error(ref: ServiceReference, err: str) -> Verdict:
    return _cannot_check("service", SERVICE_ACCESS_ERROR, ref, err)


def service_port_error(ref: ServiceReference, detail: Sequence[str] = ()) -> Verdict:
    return _failed_at("port", SERVICE_PORT_ERROR, f"{_service(ref)} is not listening on port {ref.port}", detail)


def endpoints_access_error(ref: ServiceReference, err: str) -> Verdict:
    return _cannot_check("endpoints", ENDPOINTS_ACCESS_ERROR, ref, err)


def endpoints_not_found(ref: ServiceReference, detail: Sequence[str] = ()) -> Verdict:
    return _failed_at("endpoints", ENDPOINTS_NOT_FOUND, f"cannot find endpointslices for {_service(ref)}", detail)


def missing_endpoints(ref: ServiceReference, port_name: str, detail: Sequence[str] = ()) -> Verdict:
    message = f"endpointslices for {_service(ref)} have no addresses with port name {go_quote(port_name)}"
    return _failed_at("endpoints", MISSING_ENDPOINTS, message, detail)


def failed_discovery_check(
    message: str, detail: Sequence[str], *, reason: str = FAILED_DISCOVERY_CHECK
) -> Verdict:
    """Upstream's discovery-check failure; `reason` names a refusal (FORBIDDEN_ENDPOINT,
    REDIRECT_REJECTED, PROXY_LOOP) where upstream would say FailedDiscoveryCheck."""
    return Verdict(FALSE, reason, with_detail(message, detail))


def body_excerpt(body: bytes, limit: int = BODY_EXCERPT) -> str:
    """The first bytes of a response body on one line (an empty body says so)."""
    if not body:
        return "(empty)"
    text = " ".join(body[:limit].decode("utf-8", "replace").split())
    return text + ("..." if len(body) > limit else "")
