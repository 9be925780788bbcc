"""kube-apiserver's identity, impersonation and authorization filters, for the fake kube-apiserver.

Installed with `FakeKube.enforce(KubeAuthorization(fake, policy).gate)`; `policy` answers
SubjectAccessReview specs like `FakeReviews.policy` (so one policy can judge the gateway's reviews
and the fake's own decisions). Written from upstream, independently of the gateway's code:

- identity (`authentication/request/headerrequest`): a client certificate whose CN is one of
  `front_proxy_names` vouches for `X-Remote-User` / `X-Remote-Group`; otherwise the certificate's
  CN and O, or the bearer token's user; `system:authenticated` is added;
- impersonation (`endpoints/filters/impersonation.go WithImpersonation`): `Impersonate-User`
  (a service account when it reads `system:serviceaccount:<ns>:<name>`), each `Impersonate-Group`,
  each `Impersonate-Extra-<key>` value, `Impersonate-Uid`, checked in that order with verb
  `impersonate`; the first refusal is a 403 `<resource>[.<group>] "<name>" is forbidden: User
  "<requester>" cannot impersonate resource ...`; the request then runs as exactly the impersonated
  user (its groups, plus `system:authenticated`);
- authorization of the fake's own resources (`endpoints/handlers/responsewriters/errors.go
  forbiddenMessage`, `apimachinery/pkg/api/errors NewForbidden`): a refusal is a 403
  `<resource>[.<group>][ "<name>"] is forbidden: User "<user>" cannot <verb> resource ...`.
  Routes added with `add_route` (reviews, discovery, OpenAPI) are not authorized, as kube-apiserver's
  `system:discovery` and `system:public-info-viewer` let everyone read them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fakekube import IDENTITY, USER, Attributes, FakeKube, status_response

Spec = dict[str, Any]
Policy = Callable[[Spec], dict[str, Any]]

AUTHENTICATED = "system:authenticated"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class Identity:
    name: str
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)
    uid: str = ""


@dataclass(frozen=True)
class Check:
    """One authorization question: resourceAttributes of a SubjectAccessReview."""

    verb: str
    resource: str
    group: str = ""
    version: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def attributes(self) -> dict[str, str]:
        values = {
            "namespace": self.namespace,
            "verb": self.verb,
            "group": self.group,
            "version": self.version,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
        }
        return {k: v for k, v in values.items() if v}

    def forbidden(self, user: str, reason: str) -> web.Response:
        """`responsewriters.Forbidden`: NewForbidden(group/resource, name, forbiddenMessage)."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        message = (
            f'User "{user}" cannot {self.verb} resource "{resource}" in API group "{self.group}" {scope}'
        )
        if reason:
            message += f": {reason}"
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        subject = f"{qualified} {json.dumps(self.name)}" if self.name else qualified
        details = {
            k: v for k, v in (("name", self.name), ("group", self.group), ("kind", self.resource)) if v
        }
        return status_response(403, "Forbidden", f"{subject} is forbidden: {message}", details)


class KubeAuthorization:
    def __init__(
        self, fake: FakeKube, policy: Policy, *, front_proxy_names: tuple[str, ...] = ("front-proxy-client",)
    ) -> None:
        self.fake = fake
        self.policy = policy
        self.front_proxy_names = front_proxy_names
        self.decisions: list[tuple[Spec, bool]] = []  # every question this fake asked, in order

    def install(self) -> KubeAuthorization:
        self.fake.enforce(self.gate)
        return self

    # --- the filter chain ------------------------------------------------------------------------

    def gate(self, request: web.Request, attributes: Attributes) -> web.StreamResponse | None:
        requester = self.identity(request)
        user, refusal = self.impersonate(request, requester)
        request[IDENTITY] = user.name
        if refusal is not None:
            return refusal
        res = attributes.resource
        if res is None:
            return None  # discovery, OpenAPI, reviews: everyone may
        check = Check(
            attributes.verb,
            res.resource,
            group=res.group,
            version=res.version,
            subresource=attributes.subresource,
            namespace=attributes.namespace,
            name=attributes.name,
        )
        allowed, reason = self.ask(user, check)
        return None if allowed else check.forbidden(user.name, reason)

    def identity(self, request: web.Request) -> Identity:
        name = request[USER]
        if name in self.front_proxy_names and request.headers.get("X-Remote-User"):
            groups = request.headers.getall("X-Remote-Group", [])
            return Identity(request.headers["X-Remote-User"], _with_authenticated(groups))
        return Identity(name, _with_authenticated(_certificate_groups(request)))

    def impersonate(self, request: web.Request, requester: Identity) -> tuple[Identity, web.Response | None]:
        headers = request.headers
        users = headers.getall("Impersonate-User", [])
        groups = headers.getall("Impersonate-Group", [])
        uids = headers.getall("Impersonate-Uid", [])
        extras: dict[str, list[str]] = {}
        for key in headers:
            if key.lower().startswith("impersonate-extra-"):
                extras.setdefault(key[len("impersonate-extra-") :].lower(), list(headers.getall(key)))
        if not (users or groups or uids or extras):
            return requester, None
        if not users:
            message = f'Internal Server Error: "{request.path_qs}": requested impersonation without a user'
            return requester, status_response(500, "InternalError", message)
        checks: list[Check] = []
        account = _service_account(users[0])
        if account is not None:
            checks.append(Check("impersonate", "serviceaccounts", namespace=account[0], name=account[1]))
        else:
            checks.append(Check("impersonate", "users", name=users[0]))
        checks += [Check("impersonate", "groups", name=g) for g in groups]
        for key, values in extras.items():
            checks += [
                Check("impersonate", "userextras", "authentication.k8s.io", subresource=key, name=v)
                for v in values
            ]
        if uids:
            checks.append(Check("impersonate", "uids", "authentication.k8s.io", name=uids[0]))
        for check in checks:
            allowed, reason = self.ask(requester, check)
            if not allowed:
                return requester, check.forbidden(requester.name, reason)
        impersonated = list(groups)
        if account is not None and not groups:
            impersonated = ["system:serviceaccounts", f"system:serviceaccounts:{account[0]}"]
        return Identity(users[0], _with_authenticated(impersonated), extras, uids[0] if uids else ""), None

    def ask(self, user: Identity, check: Check) -> tuple[bool, str]:
        spec: Spec = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": check.attributes(),
        }
        if user.extra:
            spec["extra"] = user.extra
        if user.uid:
            spec["uid"] = user.uid
        answer = self.policy(spec)
        allowed = bool(answer.get("allowed"))
        self.decisions.append((spec, allowed))
        return allowed, str(answer.get("reason", ""))


def _with_authenticated(groups: list[str]) -> tuple[str, ...]:
    return tuple(groups) if AUTHENTICATED in groups else (*groups, AUTHENTICATED)


def _certificate_groups(request: web.Request) -> list[str]:
    peercert = request.transport.get_extra_info("peercert") if request.transport else None
    return [v for rdn in (peercert or {}).get("subject", ()) for k, v in rdn if k == "organizationName"]


def _service_account(username: str) -> tuple[str, str] | None:
    if not username.startswith(SA_PREFIX):
        return None
    parts = username[len(SA_PREFIX) :].split(":")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None
