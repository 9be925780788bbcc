"""RBAC evaluation exactly as kube-apiserver's RBAC authorizer does it, over rules held in memory.

Ported from `plugin/pkg/auth/authorizer/rbac/rbac.go` (`RBACAuthorizer.Authorize`, `RuleAllows`),
`pkg/apis/rbac/v1/evaluation_helpers.go` (`VerbMatches`, `APIGroupMatches`, `ResourceMatches`,
`ResourceNameMatches`, `NonResourceURLMatches`) and `pkg/registry/rbac/validation/rule.go`
(`DefaultRuleResolver.VisitRulesFor`, `appliesTo`, the binding describers):

- every ClusterRoleBinding whose subjects include the user is visited first, then (for a request
  in a namespace) every RoleBinding of that namespace; the first rule that allows the request
  decides, and the reason names the binding, its role and the subject that matched;
- a rule allows a resource request when its verbs, API groups, `resource[/subresource]` (or
  `*`, or `*/<subresource>`) and resourceNames (none: any name) all match; a non-resource request
  when its verbs and a nonResourceURL (exact, `*`, or a prefix ending in `*`) match;
- subjects: a User by name, a Group by membership, a ServiceAccount by its user name
  `system:serviceaccount:<ns>:<name>` (a RoleBinding's subject without a namespace means the
  binding's own);
- nothing allows: no opinion, with `RBAC: <errors>` as the reason when a binding named a role that
  does not exist.

The policy is immutable: a change in the folder builds a new one (`rbacobjects.compile_policy`),
so the request path reads it without locks and worker processes receive it whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from aggregator.auth.verdict import Decision, Verdict
from aggregator.model.fielderrors import aggregate, go_quote
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo

GROUP = "rbac.authorization.k8s.io"
ALL = "*"  # rbacv1.VerbAll, APIGroupAll, ResourceAll, NonResourceAll
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

USER_KIND = "User"
GROUP_KIND = "Group"
SERVICE_ACCOUNT_KIND = "ServiceAccount"
ROLE = "Role"
CLUSTER_ROLE = "ClusterRole"
ROLE_BINDING = "RoleBinding"
CLUSTER_ROLE_BINDING = "ClusterRoleBinding"


@dataclass(frozen=True, slots=True)
class PolicyRule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    def allows(self, info: RequestInfo) -> bool:
        """`RuleAllows`."""
        if not (ALL in self.verbs or info.verb in self.verbs):
            return False
        if not info.is_resource_request:
            return _url_matches(self.non_resource_urls, info.path)
        if not (ALL in self.api_groups or info.api_group in self.api_groups):
            return False
        sub = info.subresource
        combined = f"{info.resource}/{sub}" if sub else info.resource
        if not _resource_matches(self.resources, combined, sub):
            return False
        return not self.resource_names or info.name in self.resource_names


def _resource_matches(resources: tuple[str, ...], combined: str, subresource: str) -> bool:
    """`ResourceMatches`: `*`, the exact `resource[/sub]`, or `*/<sub>` for a subresource request."""
    for resource in resources:
        if resource in (ALL, combined):
            return True
        if subresource and resource == f"*/{subresource}":
            return True
    return False


def _url_matches(urls: tuple[str, ...], path: str) -> bool:
    """`NonResourceURLMatches`: `*`, the exact path, or a prefix ending in `*`."""
    for url in urls:
        if url in (ALL, path):
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Subject:
    kind: str
    name: str
    namespace: str = ""

    def describe(self, binding_namespace: str) -> str:
        """`describeSubject`: `User "alice"`, `ServiceAccount "name/namespace"`."""
        if self.kind == SERVICE_ACCOUNT_KIND:
            return f"{self.kind} {go_quote(self.name + '/' + (self.namespace or binding_namespace))}"
        return f"{self.kind} {go_quote(self.name)}"


@dataclass(frozen=True, slots=True)
class RoleRef:
    kind: str  # Role or ClusterRole
    name: str


@dataclass(frozen=True, slots=True)
class Binding:
    """A RoleBinding (namespace set) or a ClusterRoleBinding (namespace empty)."""

    kind: str
    name: str
    role_ref: RoleRef
    subjects: tuple[Subject, ...]
    namespace: str = ""

    def describe(self, subject: Subject) -> str:
        """`clusterRoleBindingDescriber` / `roleBindingDescriber`."""
        name = self.name if self.kind == CLUSTER_ROLE_BINDING else f"{self.name}/{self.namespace}"
        return (
            f"{self.kind} {go_quote(name)} of {self.role_ref.kind} {go_quote(self.role_ref.name)} "
            f"to {subject.describe(self.namespace)}"
        )


def not_found(kind: str, name: str) -> str:
    """The lister's NotFound error: `clusterrole.rbac.authorization.k8s.io "x" not found`."""
    return f"{kind.lower()}.{GROUP} {go_quote(name)} not found"


@dataclass(frozen=True, slots=True)
class RuleSet:
    """`RulesFor`'s answer, as a SelfSubjectRulesReview reports it."""

    rules: tuple[PolicyRule, ...] = ()
    incomplete: bool = False
    error: str = ""  # the evaluation error (empty: none)


EVERYTHING = (
    PolicyRule(verbs=(ALL,), api_groups=(ALL,), resources=(ALL,)),
    PolicyRule(verbs=(ALL,), non_resource_urls=(ALL,)),
)


# A rule and where it came from (None: an error instead, as `VisitRulesFor`'s visitor is called).
Visit = tuple[str, PolicyRule] | tuple[None, str]


@dataclass(frozen=True, slots=True)
class _Grant:
    """One subject of one binding, indexed by who it names: what `VisitRulesFor` would find."""

    order: int  # the binding's place in the visit (ClusterRoleBindings first, then RoleBindings)
    subject: int  # the subject's place in the binding (`appliesTo` takes the first that matches)
    role_ref: RoleRef
    role_namespace: str  # where a Role is looked up: the RoleBinding's namespace
    source: str  # the binding describer's text, written once here rather than per request


# (scope: "" for ClusterRoleBindings or the RoleBinding's namespace, "user" or "group", name)
_Key = tuple[str, str, str]


def _subject_key(subject: Subject, binding_namespace: str) -> tuple[str, str] | None:
    """Who a subject names, as the user or group name a request carries (`appliesToUser`)."""
    if subject.kind == USER_KIND:
        return ("user", subject.name)
    if subject.kind == GROUP_KIND:
        return ("group", subject.name)
    if subject.kind == SERVICE_ACCOUNT_KIND:
        namespace = subject.namespace or binding_namespace
        return ("user", f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{subject.name}") if namespace else None
    return None


@dataclass(frozen=True)
class RBACPolicy:
    """Roles and bindings as kube-apiserver's listers would hold them (ClusterRoles aggregated).

    Bindings are indexed by the users and groups they name, so a request visits only the
    bindings that apply to its caller, in upstream's order, whatever the number of bindings.
    """

    cluster_roles: Mapping[str, tuple[PolicyRule, ...]] = field(default_factory=dict)
    roles: Mapping[tuple[str, str], tuple[PolicyRule, ...]] = field(default_factory=dict)
    cluster_role_bindings: tuple[Binding, ...] = ()
    role_bindings: Mapping[str, tuple[Binding, ...]] = field(default_factory=dict)
    # RBAC manifests are in the folder (valid or not): local mode authorizes with this policy
    # instead of allowing every authenticated caller.
    present: bool = False
    # What the folder holds, for the log line and the start-up summary.
    counts: Mapping[str, int] = field(default_factory=dict)
    _index: Mapping[_Key, tuple[_Grant, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[_Key, list[_Grant]] = {}
        scoped = [(b, "", b.namespace) for b in self.cluster_role_bindings]
        scoped += [(b, ns, ns) for ns, bindings in sorted(self.role_bindings.items()) for b in bindings]
        for order, (binding, scope, namespace) in enumerate(scoped):
            role_namespace = namespace if binding.kind == ROLE_BINDING else ""
            for position, subject in enumerate(binding.subjects):
                key = _subject_key(subject, binding.namespace)
                if key is not None:
                    grant = _Grant(order, position, binding.role_ref, role_namespace, binding.describe(subject))
                    index.setdefault((scope, *key), []).append(grant)
        object.__setattr__(self, "_index", {key: tuple(grants) for key, grants in index.items()})

    def _role_rules(self, ref: RoleRef, namespace: str) -> tuple[PolicyRule, ...] | str:
        """`GetRoleReferenceRules`: the rules, or the error string."""
        if ref.kind == ROLE:
            rules = self.roles.get((namespace, ref.name))
        elif ref.kind == CLUSTER_ROLE:
            rules = self.cluster_roles.get(ref.name)
        else:
            return f"unsupported role reference kind: {go_quote(ref.kind)}"
        return not_found(ref.kind, ref.name) if rules is None else rules

    def _grants(self, user: UserInfo, namespace: str) -> list[_Grant]:
        """The bindings that apply to `user` (ClusterRoleBindings, then `namespace`'s
        RoleBindings, each by name), with the first of its subjects that matched."""
        found: dict[int, _Grant] = {}
        names = [("user", user.name), *(("group", group) for group in user.groups)]
        for scope in ("", namespace) if namespace else ("",):
            for kind, name in names:
                for grant in self._index.get((scope, kind, name), ()):
                    seen = found.get(grant.order)
                    if seen is None or grant.subject < seen.subject:
                        found[grant.order] = grant
        return [found[order] for order in sorted(found)]

    def visit(self, user: UserInfo, namespace: str) -> Iterator[Visit]:
        """`VisitRulesFor`: each rule that applies to `user` in `namespace`, with its source."""
        for grant in self._grants(user, namespace):
            rules = self._role_rules(grant.role_ref, grant.role_namespace)
            if isinstance(rules, str):
                yield (None, rules)
                continue
            for rule in rules:
                yield (grant.source, rule)

    def authorize(self, user: UserInfo, info: RequestInfo) -> Verdict:
        """`RBACAuthorizer.Authorize`: allowed by the first matching rule, else no opinion."""
        errors: list[str] = []
        for grant in self._grants(user, info.namespace):
            rules = self._role_rules(grant.role_ref, grant.role_namespace)
            if isinstance(rules, str):
                errors.append(rules)
                continue
            for rule in rules:
                if rule.allows(info):
                    return Verdict(Decision.ALLOW, f"RBAC: allowed by {grant.source}")
        return Verdict(Decision.NO_OPINION, f"RBAC: {aggregate(errors)}" if errors else "")

    def rules_for(self, user: UserInfo, namespace: str) -> RuleSet:
        """`RulesFor`: every rule that applies, and the resolution errors (complete either way:
        rules only add up, so a missing role takes nothing away from what was found)."""
        rules: list[PolicyRule] = []
        errors: list[str] = []
        for source, item in self.visit(user, namespace):
            if source is None:
                assert isinstance(item, str)
                errors.append(item)
            else:
                assert isinstance(item, PolicyRule)
                rules.append(item)
        return RuleSet(tuple(rules), error=aggregate(errors) if errors else "")


EMPTY = RBACPolicy()
