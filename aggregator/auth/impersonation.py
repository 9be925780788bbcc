"""Impersonation: `Impersonate-*` headers make a request run as someone else, if the caller may.

Ported from apiserver `pkg/endpoints/filters/impersonation.go` (`WithImpersonation`,
`buildImpersonationRequests`), which kube-apiserver runs after authentication and before
authorization on every path, aggregated ones included:

- `Impersonate-User` (first value) names a user, or a service account when it reads
  `system:serviceaccount:<namespace>:<name>` with valid names (`serviceaccount.SplitUsername`);
  each `Impersonate-Group` value is a group; each value of each `Impersonate-Extra-<key>` is an
  extra (key lower-cased, then `url.PathUnescape`d); `Impersonate-Uid` (first value) is the uid.
  Groups, extras or a uid without a user: 500 `requested [...] without impersonating a user`.
- Each is checked in that order with verb `impersonate` on users, serviceaccounts, groups,
  `userextras/<key>` (group authentication.k8s.io) or uids (same group), asked as the
  authenticated caller through the gateway's authorizer: always-allow groups, then the
  `--authorization-mode` authorizers (the cached, coalesced SubjectAccessReview, RBAC from the
  folder). The first refusal is upstream's 403 Status; a failed review refuses too (upstream:
  `err != nil || decision != allow`). Impersonation is never allowed by default: local mode
  without any authorizer refuses it with a reason that says how to enable it (`modes.py`).
- The request then runs as the impersonated user, and nothing else: its groups are the
  impersonated ones (a service account's own groups when none are given), plus
  system:authenticated (or system:unauthenticated for system:anonymous) unless already there.
  The caller is kept for the audit (`RequestContext.requester`).

Upstream then deletes the headers; aiohttp's are read-only, so the proxy's header rules
(`IdentityHeaderPolicy`) drop every `Impersonate-*` header on the way to a backend instead.
Routes served by kube-apiserver (DELEGATE) are left alone: kube-apiserver applies impersonation
itself, as the only authority for what it serves, and records both the caller and the
impersonated user in its audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Protocol

from aggregator.auth.authz import forbidden, internal_error
from aggregator.auth.verdict import Decision, Verdict
from aggregator.auth.webhook import ReviewFailed
from aggregator.model.fielderrors import is_dns1123_label, is_dns1123_subdomain
from aggregator.model.userinfo import ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, UserInfo
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.routing import RouteKind
from aggregator.web.serverrequest import Response
from aggregator.wire.gourl import EscapeError, path_unescape

log = logging.getLogger(__name__)

# authentication/v1 `ImpersonateUserHeader` and friends, lower-cased for matching.
USER_HEADER = "impersonate-user"
GROUP_HEADER = "impersonate-group"
UID_HEADER = "impersonate-uid"
EXTRA_PREFIX = "impersonate-extra-"
_PREFIX = "impersonate-"

VERB = "impersonate"
AUTHENTICATION_GROUP = "authentication.k8s.io"
AUTHENTICATION_V1 = "authentication.k8s.io/v1"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
ALL_SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
SERVICE_ACCOUNT_GROUP_PREFIX = "system:serviceaccounts:"

SERVICE_ACCOUNT = "ServiceAccount"
USER = "User"
GROUP = "Group"
USER_EXTRA = "UserExtra"
UID = "UID"


class ImpersonationError(Exception):
    """Headers that name no user but something else: upstream answers with a 500."""


@dataclass(frozen=True, slots=True)
class Target:
    """One thing to impersonate: upstream's `ObjectReference` (the extra key rides in FieldPath)."""

    kind: str
    name: str
    namespace: str = ""
    api_version: str = ""
    field_path: str = ""

    def go_value(self) -> str:
        """Go's `%v` of the ObjectReference: every field, in declaration order, space-separated."""
        return f"{{{self.kind} {self.namespace} {self.name}  {self.api_version}  {self.field_path}}}"

    def attributes(self) -> RequestInfo:
        """The authorizer attributes of the check (`actingAsAttributes`)."""
        group, _, version = self.api_version.rpartition("/")
        resource, subresource = _RESOURCES[self.kind], ""
        if self.kind == USER_EXTRA:
            subresource = self.field_path
        return RequestInfo(
            is_resource_request=True,
            path="",
            verb=VERB,
            api_group=group,
            api_version=version,
            namespace=self.namespace,
            resource=resource,
            subresource=subresource,
            name=self.name,
        )


_RESOURCES = {
    SERVICE_ACCOUNT: "serviceaccounts",
    USER: "users",
    GROUP: "groups",
    USER_EXTRA: "userextras",
    UID: "uids",
}


@dataclass(frozen=True, slots=True)
class Impersonation:
    """What a request asks to be: the checks in upstream's order, and the user they add up to."""

    targets: tuple[Target, ...]
    groups_specified: bool

    def checks(self) -> list[RequestInfo]:
        return [target.attributes() for target in self.targets]

    def user(self) -> UserInfo:
        """`WithImpersonation`'s new user: only what the headers say (nothing of the caller's)."""
        name = uid = ""
        groups: list[str] = []
        extra: dict[str, list[str]] = {}
        for target in self.targets:
            if target.kind == SERVICE_ACCOUNT:
                name = f"{SERVICE_ACCOUNT_PREFIX}{target.namespace}:{target.name}"
                if not self.groups_specified:
                    groups = [ALL_SERVICE_ACCOUNTS_GROUP, SERVICE_ACCOUNT_GROUP_PREFIX + target.namespace]
            elif target.kind == USER:
                name = target.name
            elif target.kind == GROUP:
                groups.append(target.name)
            elif target.kind == USER_EXTRA:
                extra.setdefault(target.field_path, []).append(target.name)
            else:
                uid = target.name
        if name != ANONYMOUS_USER:
            if AUTHENTICATED_GROUP not in groups and UNAUTHENTICATED_GROUP not in groups:
                groups.append(AUTHENTICATED_GROUP)
        elif UNAUTHENTICATED_GROUP not in groups:
            groups.append(UNAUTHENTICATED_GROUP)
        return UserInfo(name, uid, tuple(groups), {k: tuple(v) for k, v in extra.items()})


def split_service_account(username: str) -> tuple[str, str] | None:
    """`serviceaccount.SplitUsername`: (namespace, name), or None if not a service account name."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX) :].split(":")
    if len(parts) != 2:
        return None
    namespace, name = parts
    if is_dns1123_label(namespace) or is_dns1123_subdomain(name):
        return None
    return namespace, name


def _extra_key(header_suffix: str) -> str:
    """`unescapeExtraKey(strings.ToLower(...))`: a key that does not unescape is kept raw."""
    key = header_suffix.lower()
    try:
        return path_unescape(key)
    except EscapeError:
        return key


def requested(headers: Iterable[tuple[str, str]]) -> Impersonation | None:
    """`buildImpersonationRequests` over the request's header lines. None: nothing requested.

    Raises ImpersonationError for groups, extras or a uid without a user. Extras come in the
    order their header names first appear (upstream walks a Go map: any order is upstream's).
    """
    user: str | None = None
    uid: str | None = None
    groups: list[str] = []
    extras: dict[str, list[str]] = {}
    for name, value in headers:
        if name[:12].lower() != _PREFIX:
            continue
        lowered = name.lower()
        if lowered == USER_HEADER:
            if user is None:
                user = value
        elif lowered == GROUP_HEADER:
            groups.append(value)
        elif lowered == UID_HEADER:
            if uid is None:
                uid = value
        elif lowered.startswith(EXTRA_PREFIX):
            extras.setdefault(lowered, []).append(value)
    if user is None and uid is None and not groups and not extras:
        return None  # the common case: no impersonation header at all
    targets: list[Target] = []
    if user:
        account = split_service_account(user)
        if account is not None:
            targets.append(Target(SERVICE_ACCOUNT, account[1], namespace=account[0]))
        else:
            targets.append(Target(USER, user))
    targets.extend(Target(GROUP, group) for group in groups)
    for header, values in extras.items():
        key = _extra_key(header[len(EXTRA_PREFIX) :])
        targets.extend(Target(USER_EXTRA, v, api_version=AUTHENTICATION_V1, field_path=key) for v in values)
    if uid:
        targets.append(Target(UID, uid, api_version=AUTHENTICATION_V1))
    if (groups or extras or uid) and not user:
        refs = " ".join(t.go_value() for t in targets)
        raise ImpersonationError(f"requested [{refs}] without impersonating a user")
    if not targets:
        return None
    return Impersonation(tuple(targets), groups_specified=bool(groups))


class AccessDecider(Protocol):
    """What the impersonation checks need of the authorizer (`Authorizer`)."""

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict | None: ...

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict: ...


def user_string(user: UserInfo) -> str:
    """Upstream's `userString` for the log line: `name[group,group]`."""
    name = user.name or "<empty>"
    return f"{name}[{','.join(user.groups)}]" if user.groups else name


class Impersonator:
    """The impersonation gate: after authentication, before authorization."""

    def __init__(self, decider: AccessDecider) -> None:
        self.decider = decider

    def gate(self, ctx: RequestContext) -> Response | Awaitable[Response | None] | None:
        if ctx.route.kind is RouteKind.DELEGATE:
            return None  # kube-apiserver applies the headers to what it serves
        try:
            wanted = requested(ctx.headers.items())
        except ImpersonationError as err:
            return internal_error(ctx, str(err))
        if wanted is None:
            return None
        return self._impersonate(ctx, wanted)

    async def _impersonate(self, ctx: RequestContext, wanted: Impersonation) -> Response | None:
        requester = ctx.user
        if requester is None:
            return internal_error(ctx, "no user found for request")
        for info in wanted.checks():
            verdict = self.decider.decide_now(requester, info)
            if verdict is None:
                verdict = await self._review(ctx, requester, info)
            if verdict.decision is not Decision.ALLOW:
                log.debug(
                    "Forbidden",
                    extra=fields(
                        method=ctx.method,
                        path=ctx.path,
                        user=requester.name,
                        impersonate=f"{info.resource}/{info.name}",
                        reason=verdict.reason or verdict.error,
                    ),
                )
                return forbidden(ctx, requester, info, verdict.reason)
        user = wanted.user()
        ctx.requester = requester
        ctx.user = user
        log.debug(
            "impersonating",
            extra=fields(
                method=ctx.method,
                path=ctx.path,
                requester=user_string(requester),
                user=user_string(user),
            ),
        )
        return None

    async def _review(self, ctx: RequestContext, requester: UserInfo, info: RequestInfo) -> Verdict:
        try:
            return await self.decider.review(requester, info)
        except ReviewFailed as err:
            log.error(
                "Failed to make webhook authorizer request",
                extra=fields(method=ctx.method, path=ctx.path, reason=str(err)),
            )
            # The webhook's `decisionOnError` with an empty reason: a plain 403.
            return Verdict(Decision.NO_OPINION, error=str(err))
