"""Authorization, in the order extension API servers use (`DelegatingAuthorizationOptions`).

1. always-allow groups (`--authorization-always-allow-groups`, default system:masters);
2. always-allow paths (`--authorization-always-allow-paths`, default /healthz,/readyz,/livez):
   non-resource requests only, compared without the leading `/`, exact or `prefix*`;
3. the `--authorization-mode` authorizers in order, as kube-apiserver's union authorizer runs
   them (`authorization/union`): the first that allows or denies decides; no opinion from all
   is a 403 whose reason joins theirs with newlines. `Webhook` is a SubjectAccessReview to
   kube-apiserver, cached (`cachetools.TLRUCache`, 8192 entries; allowed answers for the
   authorized TTL, others for the unauthorized TTL; requests whose attributes add up to 10000
   bytes or more are never cached) with identical concurrent reviews coalesced; `RBAC` and the
   others are in `modes.py`.

Allowed: the request goes on. A review that failed: 500, upstream's `Internal Server Error:
"<RequestURI>": <err>` text in a Status. Otherwise: upstream's 403 Status. Requests routed to
kube-apiserver itself are not reviewed here: kube-apiserver authorizes them with the same
attributes, so a second review would only double the load. A cache hit awaits nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aggregator.audit.recorder import AUTHORIZATION_DECISION
from aggregator.auth.cache import MISSING, CoalescingCache
from aggregator.auth.metrics import AuthMetrics
from aggregator.auth.rbac import RuleSet
from aggregator.auth.verdict import ALLOWED, NO_OPINION, Decision, Verdict
from aggregator.auth.webhook import ReviewFailed, WebhookClient
from aggregator.model.fielderrors import aggregate, go_quote
from aggregator.model.selectors import (
    DOES_NOT_EXIST,
    DOUBLE_EQUALS,
    EQUALS,
    EXISTS,
    IN,
    NOT_EQUALS,
    NOT_IN,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from aggregator.model.status import forbidden_details, forbidden_message
from aggregator.model.userinfo import UserInfo
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.responses import status_response
from aggregator.web.routing import RouteKind
from aggregator.web.serverrequest import Response

log = logging.getLogger(__name__)

KIND = "subjectaccessreview"
MAX_ENTRIES = 8192
# `maxControlledAttrCacheSize`: longer requester-controlled attributes are never cached.
MAX_CACHED_ATTRIBUTE_BYTES = 10000


@dataclass(frozen=True, slots=True)
class ReviewStatus:
    """A SubjectAccessReview's `status`, as cached."""

    allowed: bool
    denied: bool = False
    reason: str = ""


def verdict_from_status(status: ReviewStatus) -> Verdict:
    """`WebhookAuthorizer.Authorize`'s decision from a review status."""
    if status.allowed and status.denied:
        return Verdict(
            Decision.DENY,
            status.reason,
            "webhook subject access review returned both allow and deny response",
        )
    if status.denied:
        return Verdict(Decision.DENY, status.reason)
    if status.allowed:
        return Verdict(Decision.ALLOW, status.reason)
    return Verdict(Decision.NO_OPINION, status.reason)


# --- the SubjectAccessReview spec ------------------------------------------------------------------

_FIELD_OPERATORS = {EQUALS: "In", DOUBLE_EQUALS: "In", NOT_EQUALS: "NotIn"}
_LABEL_OPERATORS = {
    EQUALS: "In",
    DOUBLE_EQUALS: "In",
    IN: "In",
    NOT_EQUALS: "NotIn",
    NOT_IN: "NotIn",
    EXISTS: "Exists",
    DOES_NOT_EXIST: "DoesNotExist",
}

R = TypeVar("R")

# Hashable and equal exactly when the JSON specs are: the cache key (upstream keys on the JSON).
SpecKey = tuple[Any, ...]


def _parsed(selector: str, parse: Callable[[str], tuple[R, ...]]) -> tuple[R, ...]:
    """A selector's requirements; none when it is empty, or unparsable (upstream drops an
    unparsable selector from the review)."""
    if not selector:
        return ()
    try:
        return parse(selector)
    except SelectorError:
        return ()


def _field_requirements(selector: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple(
        (r.field, _FIELD_OPERATORS[r.operator], (r.value,))
        for r in _parsed(selector, parse_field_selector)
        if r.operator in _FIELD_OPERATORS
    )


def _label_requirements(selector: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    # Gt/Lt have no SubjectAccessReview operator: dropping one only broadens what is checked.
    return tuple(
        (r.key, _LABEL_OPERATORS[r.operator], r.values)
        for r in _parsed(selector, parse_label_selector)
        if r.operator in _LABEL_OPERATORS
    )


def _resource_attributes(info: RequestInfo) -> tuple[str, str, str, str, str, str, str]:
    """A resource request's attributes, in `ResourceAttributes`' order: what is reviewed, and
    (with the path) what `shouldCache` measures."""
    return (
        info.namespace,
        info.verb,
        info.api_group,
        info.api_version,
        info.resource,
        info.subresource,
        info.name,
    )


def spec_key(user: UserInfo, info: RequestInfo) -> SpecKey:
    extra = tuple(sorted(user.extra.items())) if user.extra else ()
    who = (user.name, user.uid, user.groups, extra)
    if not info.is_resource_request:
        return (*who, False, info.path, info.verb)
    return (
        *who,
        True,
        *_resource_attributes(info),
        _field_requirements(info.field_selector),
        _label_requirements(info.label_selector),
    )


def spec_document(key: SpecKey) -> dict[str, Any]:
    """The `spec` of the review, fields in Go's order and omitted when empty (`omitempty`)."""
    name, uid, groups, extra, is_resource, *attributes = key
    spec: dict[str, Any] = {}
    if is_resource:
        namespace, verb, group, version, resource, subresource, obj, field_reqs, label_reqs = attributes
        resource_attributes = {
            k: v
            for k, v in (
                ("namespace", namespace),
                ("verb", verb),
                ("group", group),
                ("version", version),
                ("resource", resource),
                ("subresource", subresource),
                ("name", obj),
            )
            if v
        }
        if field_reqs:
            resource_attributes["fieldSelector"] = {
                "requirements": [{"key": k, "operator": op, "values": list(v)} for k, op, v in field_reqs]
            }
        if label_reqs:
            resource_attributes["labelSelector"] = {
                "requirements": [
                    {"key": k, "operator": op, **({"values": list(v)} if v else {})}
                    for k, op, v in label_reqs
                ]
            }
        spec["resourceAttributes"] = resource_attributes
    else:
        path, verb = attributes
        spec["nonResourceAttributes"] = {k: v for k, v in (("path", path), ("verb", verb)) if v}
    if name:
        spec["user"] = name
    if groups:
        spec["groups"] = list(groups)
    if extra:
        spec["extra"] = {k: list(v) for k, v in extra}
    if uid:
        spec["uid"] = uid
    return spec


def attribute_bytes(info: RequestInfo) -> int:
    """`shouldCache`'s measure: namespace+verb+group+version+resource+subresource+name+path, in bytes."""
    return sum(
        len(part.encode("utf-8", "surrogateescape")) for part in (*_resource_attributes(info), info.path)
    )


class SubjectAccessReviewer:
    """The webhook authorizer: cached, coalesced SubjectAccessReviews."""

    def __init__(
        self,
        webhook: WebhookClient,
        *,
        allowed_ttl: float,
        denied_ttl: float,
        metrics: AuthMetrics,
        maxsize: int = MAX_ENTRIES,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.webhook = webhook
        self.metrics = metrics
        # Bound once: a labelled child lookup per request would cost more than the cache hit.
        self._hits = metrics.authz_cache.labels("hit")
        self._misses = metrics.authz_cache.labels("miss")
        self._cache: CoalescingCache[SpecKey, ReviewStatus] = CoalescingCache(
            ttl_for=lambda status: allowed_ttl if status.allowed else denied_ttl, maxsize=maxsize, timer=timer
        )

    def cached(self, key: SpecKey) -> Verdict | None:
        """The verdict from the cache, or None. No await, no I/O."""
        status = self._cache.get(key)
        if status is MISSING:
            self._misses.inc()
            return None
        self._hits.inc()
        assert isinstance(status, ReviewStatus)
        return verdict_from_status(status)

    async def review(self, key: SpecKey, *, cache: bool = True) -> Verdict:
        """Ask kube-apiserver (or join the identical review in flight). Raises ReviewFailed."""
        if not cache:
            return verdict_from_status(await self._create(key))
        status = await self._cache.fetch(key, lambda: self._create(key))
        return verdict_from_status(status)

    async def _create(self, key: SpecKey) -> ReviewStatus:
        review = await self.webhook.create(
            {
                "kind": "SubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "spec": spec_document(key),
            }
        )
        status = review.get("status") or {}
        if not isinstance(status, Mapping):
            raise ReviewFailed("SubjectAccessReview answer has no status object")
        return ReviewStatus(
            bool(status.get("allowed")), bool(status.get("denied")), str(status.get("reason") or "")
        )


class AlwaysAllowPaths:
    """`path.NewAuthorizer`: exact paths and `prefix*` entries, leading `/` ignored."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.prefixes: list[str] = []
        for entry in entries:
            stripped = entry.removeprefix("/")
            if not stripped:
                self.exact.add(stripped)
                continue
            if "*" in stripped[:-1]:
                raise ValueError(f"only trailing * allowed in {entry!r}")
            if stripped.endswith("*"):
                self.prefixes.append(stripped[:-1])
            else:
                self.exact.add(stripped)

    def allows(self, info: RequestInfo) -> bool:
        if info.is_resource_request:
            return False
        path = info.path.removeprefix("/")
        return path in self.exact or any(path.startswith(p) for p in self.prefixes)


def internal_error(ctx: RequestContext, err: str) -> Response:
    """`responsewriters.InternalError`'s text, as a Status (every gateway error is a Status)."""
    return status_response(ctx, 500, f"Internal Server Error: {go_quote(ctx.target)}: {err}")


def forbidden(ctx: RequestContext | None, user: UserInfo, info: RequestInfo, reason: str) -> Response:
    if info.is_resource_request:
        message = forbidden_message(
            user.name,
            info.verb,
            resource=info.resource,
            subresource=info.subresource,
            group=info.api_group,
            name=info.name,
            namespace=info.namespace,
            reason=reason,
        )
        details = forbidden_details(info.resource, info.api_group, info.name)
    else:
        message = forbidden_message(user.name, info.verb, path=info.path, reason=reason)
        details = forbidden_details("", "", "")
    return status_response(ctx, 403, message, details=details)


class Mode(Protocol):
    """One `--authorization-mode` authorizer (`authorizer.Authorizer` plus `RuleResolver`)."""

    name: str

    @property
    def allows_everything(self) -> bool:
        """True while it allows every request (the gate then skips RequestInfo altogether)."""
        ...

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict | None:
        """The verdict without I/O, or None when it has to ask (then `review`)."""
        ...

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict:
        """The verdict, asking kube-apiserver if need be. Raises ReviewFailed."""
        ...

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet: ...


WEBHOOK_RULES = RuleSet(incomplete=True, error="webhook authorizer does not support user rule resolution")


class WebhookMode:
    """`Webhook`: the cached, coalesced SubjectAccessReview."""

    name = "Webhook"
    allows_everything = False

    def __init__(self, reviewer: SubjectAccessReviewer) -> None:
        self.reviewer = reviewer

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict | None:
        return self.reviewer.cached(spec_key(user, info))

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict:
        return await self.reviewer.review(
            spec_key(user, info), cache=attribute_bytes(info) < MAX_CACHED_ATTRIBUTE_BYTES
        )

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet:
        return WEBHOOK_RULES


def _union(verdicts: list[Verdict]) -> Verdict:
    """No authorizer had an opinion: their reasons joined by newlines (`unionAuthzHandler`)."""
    reasons = [v.reason for v in verdicts if v.reason]
    return Verdict(Decision.NO_OPINION, "\n".join(reasons)) if reasons else NO_OPINION


class Authorizer:
    """The authorization gate (after authentication in `gateway.gates`)."""

    def __init__(
        self,
        *,
        always_allow_groups: Iterable[str],
        always_allow_paths: Iterable[str],
        modes: Sequence[Mode],
    ) -> None:
        if not modes:
            raise ValueError("at least one authorization-mode must be passed")
        self.always_allow_groups = frozenset(always_allow_groups)
        self.always_allow_paths = AlwaysAllowPaths(always_allow_paths)
        self.modes = tuple(modes)
        self._first = self.modes[0]

    def mode(self, name: str) -> Mode | None:
        return next((m for m in self.modes if m.name == name), None)

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict | None:
        """Everything that needs no I/O: the always-allowed groups and paths, then each mode in
        order while it can answer without asking (a webhook's cache)."""
        if not self.always_allow_groups.isdisjoint(user.groups):
            return ALLOWED
        if self.always_allow_paths.allows(info):
            return ALLOWED
        undecided: list[Verdict] = []
        for mode in self.modes:
            verdict = mode.decide_now(user, info)
            if verdict is None:
                return None
            if verdict.decision is not Decision.NO_OPINION:
                return verdict
            undecided.append(verdict)
        return _union(undecided)

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict:
        """The modes' answer when `decide_now` had none (a webhook joins an identical review in
        flight). Raises ReviewFailed."""
        undecided: list[Verdict] = []
        for mode in self.modes:
            verdict = await mode.review(user, info)
            if verdict.decision is not Decision.NO_OPINION:
                return verdict
            undecided.append(verdict)
        return _union(undecided)

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet:
        """`unionAuthzRulesHandler.RulesFor`: every mode's rules; incomplete if any is."""
        sets = [mode.rules_for(user, namespace) for mode in self.modes]
        errors = [s.error for s in sets if s.error]
        return RuleSet(
            tuple(rule for s in sets for rule in s.rules),
            incomplete=any(s.incomplete for s in sets),
            error=aggregate(errors) if errors else "",
        )

    def gate(self, ctx: RequestContext) -> Response | Awaitable[Response | None] | None:
        """Allowed or refused without an await when nothing needs a review (a cache hit)."""
        if ctx.route.kind is RouteKind.DELEGATE:
            return None  # kube-apiserver authorizes what it serves
        user = ctx.user
        if user is None:
            return internal_error(ctx, "no user found for request")
        if self._first.allows_everything or not self.always_allow_groups.isdisjoint(user.groups):
            # Allowed whatever the request is (the hot path of system:masters callers and of
            # AlwaysAllow).
            AUTHORIZATION_DECISION.set(ctx, (True, ""))
            return None
        info = ctx.info
        if info is None:
            return internal_error(ctx, f"failed to create RequestInfo: {ctx.info_error}")
        verdict = self.decide_now(user, info)
        if verdict is None:
            return self._reviewed(ctx, user, info)
        return self._apply(ctx, user, info, verdict)

    async def _reviewed(self, ctx: RequestContext, user: UserInfo, info: RequestInfo) -> Response | None:
        try:
            verdict = await self.review(user, info)
        except ReviewFailed as err:
            log.error(
                "Failed to make webhook authorizer request",
                extra=fields(method=ctx.method, path=ctx.path, reason=str(err)),
            )
            return internal_error(ctx, str(err))
        return self._apply(ctx, user, info, verdict)

    @staticmethod
    def _apply(ctx: RequestContext, user: UserInfo, info: RequestInfo, verdict: Verdict) -> Response | None:
        if verdict.decision is Decision.ALLOW:
            AUTHORIZATION_DECISION.set(ctx, (True, verdict.reason))
            return None
        if verdict.error:
            return internal_error(ctx, verdict.error)
        AUTHORIZATION_DECISION.set(ctx, (False, verdict.reason))
        log.debug(
            "Forbidden",
            extra=fields(method=ctx.method, path=ctx.path, user=user.name, reason=verdict.reason),
        )
        return forbidden(ctx, user, info, verdict.reason)
