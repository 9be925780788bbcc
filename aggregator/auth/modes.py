"""`--authorization-mode`: which authorizers run after the always-allowed groups and paths.

kube-apiserver's names and checks (`pkg/kubeapiserver/options/authorization.go`
`BuiltInAuthorizationOptions.Validate`), for the modes the gateway has:

- `Webhook`: a SubjectAccessReview to kube-apiserver (`authz.WebhookMode`);
- `RBAC`: Role, ClusterRole, RoleBinding and ClusterRoleBinding manifests from `--apiservices-dir`
  (`RBACMode`; local mode only: in a cluster, kube-apiserver's RBAC answers the webhook);
- `AlwaysAllow`: every request, impersonation included. Never a default: it must be named, and
  the start says so loudly.

Unset, the mode is the gateway's default for where it runs: `Webhook` in kube mode; in local mode
`RBAC` from the folder, then `Webhook` when a kubeconfig is given. In local mode's default, RBAC
applies while the folder holds RBAC manifests; without any, the webhook decides alone, and
without a kubeconfig either every authenticated caller is allowed, as local mode always did, but
never impersonation: impersonation is an authorization decision, and nothing would have made
it. Such a request gets a 403 whose reason says how to enable it (`IMPERSONATION_HINT`).
"""

from __future__ import annotations

import enum
from typing import Protocol

from aggregator.auth.rbac import EVERYTHING, RBACPolicy, RuleSet
from aggregator.auth.rbacobjects import compile_policy
from aggregator.auth.verdict import ALLOWED, NO_OPINION, Decision, Verdict
from aggregator.model.fielderrors import go_quote
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo

ALWAYS_ALLOW = "AlwaysAllow"
RBAC = "RBAC"
WEBHOOK = "Webhook"
SUPPORTED = (ALWAYS_ALLOW, RBAC, WEBHOOK)
# kube-apiserver's `AuthorizationModeChoices`: valid names the gateway does not implement.
UPSTREAM_ONLY = ("AlwaysDeny", "ABAC", "Node")

IMPERSONATE = "impersonate"
IMPERSONATION_HINT = (
    "impersonation is an authorization decision and no authorizer is configured: grant "
    '"impersonate" with RBAC manifests in --apiservices-dir, pass --kubeconfig or '
    "--authorization-kubeconfig to ask kube-apiserver, or start with --authorization-mode=AlwaysAllow"
)
FALLBACK_RULES = RuleSet(
    EVERYTHING,
    incomplete=True,
    error="no RBAC manifests in --apiservices-dir: every authenticated caller is allowed everything but impersonation",
)
ALWAYS_ALLOW_RULES = RuleSet(EVERYTHING)


class ModeError(ValueError):
    """A `--authorization-mode` value the gateway refuses; `str()` is the problem."""


def _go_list(values: list[str]) -> str:
    """Go's `%q` of a []string."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"


def check_modes(modes: list[str], *, local_mode: bool, has_kubeconfig: bool) -> None:
    """Raise ModeError naming the first problem, in kube-apiserver's words where it has them."""
    if not modes:
        raise ModeError("at least one authorization-mode must be passed")
    for mode in modes:
        if mode in UPSTREAM_ONLY:
            raise ModeError(
                f"authorization-mode {go_quote(mode)} is not supported by the gateway: use {', '.join(SUPPORTED)}"
            )
        if mode not in SUPPORTED:
            raise ModeError(f"authorization-mode {go_quote(mode)} is not a valid mode")
    if len(set(modes)) != len(modes):
        raise ModeError(f"authorization-mode {_go_list(modes)} has mode specified more than once")
    if RBAC in modes and not local_mode:
        raise ModeError(
            "authorization-mode RBAC reads its roles and bindings from --apiservices-dir; "
            "in kube mode the cluster's RBAC answers through Webhook"
        )
    if WEBHOOK in modes and not has_kubeconfig:
        raise ModeError(
            "authorization-mode Webhook needs --kubeconfig or --authorization-kubeconfig to send "
            "SubjectAccessReviews to"
        )


def default_modes(*, local_mode: bool, has_kubeconfig: bool) -> list[str]:
    if not local_mode:
        return [WEBHOOK]
    return [RBAC, WEBHOOK] if has_kubeconfig else [RBAC]


class AlwaysAllowMode:
    """`AlwaysAllow` (`authorizerfactory.NewAlwaysAllowAuthorizer`)."""

    name = ALWAYS_ALLOW
    allows_everything = True

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict:
        return ALLOWED

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict:
        return ALLOWED

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet:
        return ALWAYS_ALLOW_RULES


class PolicySource(Protocol):
    """Where the current RBAC policy is read: the folder (`rbacfolder.RBACFolder`), or in a
    worker process the control's copy (`PolicyHolder`)."""

    @property
    def current(self) -> RBACPolicy: ...


class PolicyHolder:
    """A worker's copy of the control's policy. Until the first copy arrives it holds no
    folder rules but counts as present, so nothing falls back to allowing everyone."""

    def __init__(self, policy: RBACPolicy | None = None) -> None:
        self.current = policy or compile_policy((), present=True)

    def use(self, policy: RBACPolicy) -> None:
        self.current = policy


def _impersonation(info: RequestInfo) -> bool:
    return info.is_resource_request and info.verb == IMPERSONATE


class WithoutManifests(enum.Enum):
    """What `RBAC` does while the folder holds no RBAC manifest."""

    EVALUATE = "evaluate"  # named on the command line: the built-in roles alone, as kube-apiserver
    DEFER = "defer"  # local mode's default before Webhook: no opinion, the webhook decides
    ALLOW_AUTHENTICATED = "allow-authenticated"  # local mode's default alone: all but impersonation


class RBACMode:
    """`RBAC` over the folder's manifests (`PolicySource`); without any, `without` decides."""

    name = RBAC

    def __init__(
        self, source: PolicySource, *, without: WithoutManifests = WithoutManifests.EVALUATE
    ) -> None:
        self.source = source
        self.without = without

    def _absent(self) -> WithoutManifests | None:
        return None if self.source.current.present else self.without

    @property
    def allows_everything(self) -> bool:
        return self._absent() is WithoutManifests.ALLOW_AUTHENTICATED

    def decide_now(self, user: UserInfo, info: RequestInfo) -> Verdict:
        absent = self._absent()
        if absent is WithoutManifests.ALLOW_AUTHENTICATED:
            return Verdict(Decision.NO_OPINION, IMPERSONATION_HINT) if _impersonation(info) else ALLOWED
        if absent is WithoutManifests.DEFER:
            return NO_OPINION
        return self.source.current.authorize(user, info)

    async def review(self, user: UserInfo, info: RequestInfo) -> Verdict:
        return self.decide_now(user, info)

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet:
        absent = self._absent()
        if absent is WithoutManifests.ALLOW_AUTHENTICATED:
            return FALLBACK_RULES
        if absent is WithoutManifests.DEFER:
            return RuleSet()
        return self.source.current.rules_for(user, namespace)
