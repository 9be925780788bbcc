"""Does a request match a FlowSchema: `k8s.io/apiserver/pkg/util/flowcontrol/rule.go`, compiled.

Subjects depend only on the user, rules only on the request, so a FlowSchema is split into its
rules' subject tests and request tests: the classifier (`classifier.py`) remembers which rules'
subjects a user passes and evaluates only those rules' request tests per request. The semantics are
upstream's exactly: a `*` in a list matches everything only as the list's one member (validation
ensures it is alone); a resource rule matches a namespaced request by its namespace list and a
cluster-scoped one by `clusterScope`; a non-resource URL ending in `*` matches the path with that
prefix, and any URL also matches paths below it (`/healthz` matches `/healthz/etcd`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.flowcontrol.objects import (
    GROUP_KIND,
    NAME_ALL,
    SERVICE_ACCOUNT,
    USER,
    NonResourceRule,
    PolicyRules,
    ResourceRule,
    Subject,
)
from aggregator.web.requestinfo import RequestInfo

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


def _contains(value: str, values: frozenset[str] | None) -> bool:
    """`containsString` with the wildcard compiled away: None is "everything"."""
    return values is None or value in values


def _compiled(values: tuple[str, ...], wildcard: str = "*") -> frozenset[str] | None:
    return None if len(values) == 1 and values[0] == wildcard else frozenset(values)


def subject_matches(subject: Subject, name: str, groups: tuple[str, ...]) -> bool:
    """`matchesSubject`."""
    if subject.kind == USER:
        return subject.user is not None and (subject.user == NAME_ALL or subject.user == name)
    if subject.kind == GROUP_KIND:
        if subject.group is None:
            return False
        return subject.group == "*" or subject.group in groups
    if subject.kind == SERVICE_ACCOUNT:
        if subject.service_account is None:
            return False
        namespace, account = subject.service_account
        if account == NAME_ALL:
            # serviceAccountMatchesNamespace: prefix, then the namespace, then a ":".
            rest = name[len(SERVICE_ACCOUNT_PREFIX) :] if name.startswith(SERVICE_ACCOUNT_PREFIX) else None
            return rest is not None and rest.startswith(namespace) and rest[len(namespace) :].startswith(":")
        return name == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{account}"
    return False


@dataclass(frozen=True, slots=True)
class _ResourceTest:
    verbs: frozenset[str] | None
    resources: frozenset[str] | None
    groups: frozenset[str] | None
    cluster_scope: bool
    namespaces: frozenset[str] | None

    def matches(self, info: RequestInfo) -> bool:
        """`matchesResourcePolicyRule`."""
        if not _contains(info.verb, self.verbs):
            return False
        if self.resources is not None:
            resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
            if resource not in self.resources:
                return False
        if not _contains(info.api_group, self.groups):
            return False
        if not info.namespace:
            return self.cluster_scope
        return _contains(info.namespace, self.namespaces)


@dataclass(frozen=True, slots=True)
class _NonResourceTest:
    verbs: frozenset[str] | None
    urls: tuple[str, ...]
    prefixes: tuple[str, ...]
    every_url: bool

    def matches(self, info: RequestInfo) -> bool:
        """`matchesNonResourcePolicyRule` / `matchPolicyRuleNonResourceURL`."""
        if not _contains(info.verb, self.verbs):
            return False
        path = info.path
        if self.every_url or path in self.urls:
            return True
        return any(path.startswith(prefix) for prefix in self.prefixes)


def _resource_test(rule: ResourceRule) -> _ResourceTest:
    return _ResourceTest(
        _compiled(rule.verbs),
        _compiled(rule.resources),
        _compiled(rule.api_groups),
        rule.cluster_scope,
        _compiled(rule.namespaces),
    )


def _prefix(url: str) -> str:
    prefix = url.removesuffix("*")
    return prefix if prefix.endswith("/") else prefix + "/"


def _non_resource_test(rule: NonResourceRule) -> _NonResourceTest:
    urls = rule.non_resource_urls
    return _NonResourceTest(_compiled(rule.verbs), urls, tuple(_prefix(u) for u in urls), "*" in urls)


@dataclass(frozen=True, slots=True)
class RuleTest:
    """One `PolicyRulesWithSubjects`: its subjects, and what a request must be to match it.
    `every_resource` / `every_url`: a rule that matches every resource (every URL) request, as the
    catch-all rules of most FlowSchemas do, answers without looking at the request."""

    subjects: tuple[Subject, ...]
    resource: tuple[_ResourceTest, ...]
    non_resource: tuple[_NonResourceTest, ...]
    every_resource: bool = False
    every_url: bool = False

    def user_matches(self, name: str, groups: tuple[str, ...]) -> bool:
        """`matchesASubject`."""
        return any(subject_matches(s, name, groups) for s in self.subjects)

    def request_matches(self, info: RequestInfo) -> bool:
        """The request half of `matchesPolicyRule`."""
        if info.is_resource_request:
            return self.every_resource or any(test.matches(info) for test in self.resource)
        return self.every_url or any(test.matches(info) for test in self.non_resource)


def _everything(test: _ResourceTest) -> bool:
    return (
        test.verbs is None
        and test.resources is None
        and test.groups is None
        and test.namespaces is None
        and test.cluster_scope
    )


def compile_rules(rules: PolicyRules) -> RuleTest:
    resource = tuple(_resource_test(r) for r in rules.resource_rules)
    non_resource = tuple(_non_resource_test(r) for r in rules.non_resource_rules)
    return RuleTest(
        rules.subjects,
        resource,
        non_resource,
        every_resource=any(_everything(t) for t in resource),
        every_url=any(t.verbs is None and t.every_url for t in non_resource),
    )
