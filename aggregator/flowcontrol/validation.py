"""kube-apiserver's validation of FlowSchema and PriorityLevelConfiguration, with its messages.

Ported from `pkg/apis/flowcontrol/validation/validation.go` (`ValidateFlowSchema`,
`ValidatePriorityLevelConfiguration` and what they call) and the cluster-scoped part of
`ValidateObjectMeta`; the messages are apimachinery's `field.Error` strings (`model/fielderrors.py`),
so a refused manifest reads as `kubectl apply` would have reported it. Values upstream prints with
Go's `%#v` (a list of verbs, a struct) are printed the same way; a whole spec (the mandatory objects'
"must equal the fixed value") is printed in Go syntax without the pointers' addresses.
"""

from __future__ import annotations

import math

from aggregator.flowcontrol.objects import (
    BY_NAMESPACE,
    BY_USER,
    EXEMPT,
    EXEMPT_TYPE,
    GROUP_KIND,
    LIMITED,
    MAX_MATCHING_PRECEDENCE,
    NAME_ALL,
    QUEUE,
    REJECT,
    SERVICE_ACCOUNT,
    USER,
    FlowSchema,
    Meta,
    NonResourceRule,
    PolicyRules,
    PriorityLevel,
    PriorityLevelSpec,
    Queuing,
    ResourceRule,
    Subject,
)
from aggregator.model import fielderrors as fe

SUPPORTED_VERBS = frozenset({"get", "list", "create", "update", "delete", "deletecollection", "patch", "watch", "proxy"})
SUPPORTED_DISTINGUISHERS = (BY_NAMESPACE, BY_USER)
SUPPORTED_SUBJECT_KINDS = (GROUP_KIND, SERVICE_ACCOUNT, USER)
SUPPORTED_TYPES = (EXEMPT_TYPE, LIMITED)
SUPPORTED_LIMIT_RESPONSES = (QUEUE, REJECT)
MAX_QUEUES = 10 * 1000 * 1000
MAX_HASH_BITS = 60  # shufflesharding.MaxHashBits
NS_ERR_INTRO = "each member of this list must be '*' or a DNS-1123 label; "
# v1beta3's round-trip annotation, forbidden on stored objects.
PRESERVE_ZERO_SHARES = "flowcontrol.k8s.io/v1beta3-preserve-zero-concurrency-shares"


def required_entropy_bits(deck_size: int, hand_size: int) -> int:
    """`shufflesharding.RequiredEntropyBits`."""
    return math.ceil(math.log2(deck_size) * hand_size)


def go_strings(values: tuple[str, ...]) -> str:
    """Go's `%#v` of a []string."""
    return "[]string{" + ", ".join(fe.go_quote(v) for v in values) + "}"


def _invalid_raw(path: str, printed: str, detail: str) -> str:
    """`field.Invalid` of a value Go prints with `%#v` (already formatted)."""
    return f"{path}: {fe.INVALID}: {printed}: {detail}"


def validate_meta(meta: Meta) -> list[str]:
    """`ValidateObjectMeta(meta, false, NameIsDNSSubdomain, ...)` for a cluster-scoped object."""
    if not meta.name:
        return [fe.required("metadata.name", "name or generateName is required")]
    return [fe.invalid("metadata.name", meta.name, msg) for msg in fe.is_dns1123_subdomain(meta.name)]


def _has_wildcard(values: tuple[str, ...]) -> bool:
    return "*" in values


def _verbs(verbs: tuple[str, ...], path: str) -> list[str]:
    if not verbs:
        return [fe.required(f"{path}.verbs", "verbs must contain at least one value")]
    if _has_wildcard(verbs):
        if len(verbs) > 1:
            return [_invalid_raw(f"{path}.verbs", go_strings(verbs), "if '*' is present, must not specify other verbs")]
        return []
    if not set(verbs) <= SUPPORTED_VERBS:
        listed = ", ".join(fe.go_quote(v) for v in sorted(SUPPORTED_VERBS))
        return [f"{path}.verbs: {fe.UNSUPPORTED}: {go_strings(verbs)}: supported values: {listed}"]
    return []


def validate_non_resource_url(url: str, path: str) -> str | None:
    """`ValidateNonResourceURLPath`."""
    if not url:
        return fe.invalid(path, url, "must not be empty")
    if url == "/":
        return None
    if not url.startswith("/"):
        return fe.invalid(path, url, "must start with slash")
    if " " in url:
        return fe.invalid(path, url, "must not contain white-space")
    if "//" in url:
        return fe.invalid(path, url, "must not contain double slash")
    wildcards = url.count("*")
    if wildcards > 1 or (wildcards == 1 and url[-2:] != "/*"):
        return fe.invalid(path, url, "wildcard can only do suffix matching")
    return None


def _non_resource_rule(rule: NonResourceRule, path: str) -> list[str]:
    errors = _verbs(rule.verbs, path)
    urls = rule.non_resource_urls
    if not urls:
        errors.append(fe.required(f"{path}.nonResourceURLs", "nonResourceURLs must contain at least one value"))
    elif _has_wildcard(urls):
        if len(urls) > 1:
            errors.append(
                _invalid_raw(
                    f"{path}.nonResourceURLs", go_strings(urls), "if '*' is present, must not specify other non-resource URLs"
                )
            )
    else:
        for index, url in enumerate(urls):
            error = validate_non_resource_url(url, f"{path}.nonResourceURLs[{index}]")
            if error is not None:
                errors.append(error)
    return errors


def _resource_rule(rule: ResourceRule, path: str) -> list[str]:
    errors = _verbs(rule.verbs, path)
    if not rule.api_groups:
        errors.append(fe.required(f"{path}.apiGroups", "resource rules must supply at least one api group"))
    elif len(rule.api_groups) > 1 and _has_wildcard(rule.api_groups):
        errors.append(
            _invalid_raw(f"{path}.apiGroups", go_strings(rule.api_groups), "if '*' is present, must not specify other api groups")
        )
    if not rule.resources:
        errors.append(fe.required(f"{path}.resources", "resource rules must supply at least one resource"))
    elif len(rule.resources) > 1 and _has_wildcard(rule.resources):
        errors.append(
            _invalid_raw(f"{path}.resources", go_strings(rule.resources), "if '*' is present, must not specify other resources")
        )
    if not rule.namespaces and not rule.cluster_scope:
        errors.append(
            fe.required(
                f"{path}.namespaces", "resource rules that are not cluster scoped must supply at least one namespace"
            )
        )
    elif _has_wildcard(rule.namespaces):
        if len(rule.namespaces) > 1:
            errors.append(
                _invalid_raw(f"{path}.namespaces", go_strings(rule.namespaces), "if '*' is present, must not specify other namespaces")
            )
    else:
        for index, namespace in enumerate(rule.namespaces):
            errors.extend(
                fe.invalid(f"{path}.namespaces[{index}]", namespace, NS_ERR_INTRO + msg)
                for msg in fe.is_dns1123_label(namespace)
            )
    return errors


# The subject's members in the order upstream checks that the ones its kind does not name are unset.
_MEMBERS = ((SERVICE_ACCOUNT, "serviceAccount"), (USER, "user"), (GROUP_KIND, "group"))


def _subject(subject: Subject, path: str) -> list[str]:
    """`ValidateFlowSchemaSubject`: the member the kind names is checked, the other two must be unset."""
    if subject.kind == SERVICE_ACCOUNT:
        errors = _service_account(subject.service_account, f"{path}.serviceAccount")
    elif subject.kind == USER:
        errors = _named(subject.user, f"{path}.user", "user", USER)
    elif subject.kind == GROUP_KIND:
        errors = _named(subject.group, f"{path}.group", "group", GROUP_KIND)
    else:
        listed = ", ".join(fe.go_quote(k) for k in SUPPORTED_SUBJECT_KINDS)
        return [f"{path}.kind: {fe.UNSUPPORTED}: {fe.go_quote(subject.kind)}: supported values: {listed}"]
    members = {SERVICE_ACCOUNT: subject.service_account, USER: subject.user, GROUP_KIND: subject.group}
    for kind, member in _MEMBERS:
        if kind != subject.kind and members[kind] is not None:
            errors.append(fe.forbidden(f"{path}.{member}", f"{member} is forbidden when subject kind is not '{kind}'"))
    return errors


def _service_account(account: tuple[str, str] | None, where: str) -> list[str]:
    """`ValidateServiceAccountSubject`."""
    if account is None:
        return [fe.required(where, "serviceAccount is required when subject kind is 'ServiceAccount'")]
    errors: list[str] = []
    namespace, name = account
    if not name:
        errors.append(fe.required(f"{where}.name"))
    elif name != NAME_ALL:
        errors.extend(fe.invalid(f"{where}.name", name, msg) for msg in fe.is_dns1123_subdomain(name))
    if namespace:
        errors.extend(fe.invalid(f"{where}.namespace", namespace, msg) for msg in fe.is_dns1123_label(namespace))
    else:
        errors.append(fe.required(f"{where}.namespace", "must specify namespace for service account"))
    return errors


def _named(name: str | None, where: str, member: str, kind: str) -> list[str]:
    """`ValidateUserSubject` and `ValidateGroupSubject`: the member is there, with a name."""
    if name is None:
        return [fe.required(where, f"{member} is required when subject kind is '{kind}'")]
    return [] if name else [fe.required(f"{where}.name")]


def _policy_rules(rules: PolicyRules, path: str) -> list[str]:
    errors: list[str] = []
    if rules.subjects:
        for index, subject in enumerate(rules.subjects):
            errors += _subject(subject, f"{path}.subjects[{index}]")
    else:
        errors.append(fe.required(f"{path}.subjects", "subjects must contain at least one value"))
    if not rules.resource_rules and not rules.non_resource_rules:
        errors.append(fe.required(path, "at least one of resourceRules and nonResourceRules has to be non-empty"))
    for index, rule in enumerate(rules.resource_rules):
        errors += _resource_rule(rule, f"{path}.resourceRules[{index}]")
    for index, nrule in enumerate(rules.non_resource_rules):
        errors += _non_resource_rule(nrule, f"{path}.nonResourceRules[{index}]")
    return errors


def validate_flow_schema(fs: FlowSchema, mandatory: FlowSchema | None = None) -> list[str]:
    """`ValidateFlowSchema`; `mandatory` is the bootstrap object of the same name, if it is one."""
    errors = validate_meta(fs.meta)
    spec = fs.spec
    precedence = spec.matching_precedence
    if precedence <= 0:
        errors.append(fe.invalid("spec.matchingPrecedence", precedence, "must be a positive value"))
    if precedence > MAX_MATCHING_PRECEDENCE:
        errors.append(
            fe.invalid("spec.matchingPrecedence", precedence, f"must not be greater than {MAX_MATCHING_PRECEDENCE}")
        )
    if precedence == 1 and fs.name != EXEMPT:
        errors.append(
            fe.invalid("spec.matchingPrecedence", precedence, "only the schema named 'exempt' may have matchingPrecedence 1")
        )
    if spec.distinguisher is not None and spec.distinguisher not in SUPPORTED_DISTINGUISHERS:
        listed = ", ".join(fe.go_quote(d) for d in SUPPORTED_DISTINGUISHERS)
        printed = f"flowcontrol.FlowDistinguisherMethod{{Type:{fe.go_quote(spec.distinguisher)}}}"
        errors.append(f"spec.distinguisherMethod.type: {fe.UNSUPPORTED}: {printed}: supported values: {listed}")
    if spec.priority_level:
        errors.extend(
            fe.invalid("spec.priorityLevelConfiguration.name", spec.priority_level, msg)
            for msg in fe.is_dns1123_subdomain(spec.priority_level)
        )
    else:
        errors.append(fe.required("spec.priorityLevelConfiguration.name", "must reference a priority level"))
    for index, rules in enumerate(spec.rules):
        errors += _policy_rules(rules, f"spec.rules[{index}]")
    if mandatory is not None and spec != mandatory.spec:
        errors.append(_invalid_raw("spec", go_flow_schema_spec(fs), f"spec of '{fs.name}' must equal the fixed value"))
    errors += _conditions(fs.conditions)
    return errors


def _conditions(conditions: tuple[object, ...]) -> list[str]:
    """`ValidateFlowSchemaStatus` / `ValidatePriorityLevelConfigurationStatus`."""
    errors: list[str] = []
    seen: set[str] = set()
    for index, condition in enumerate(conditions):
        kind = str(getattr(condition, "type", ""))
        path = f"status.conditions[{index}].type"
        if kind in seen:
            errors.append(f"{path}: Duplicate value: {fe.go_quote(kind)}")
        seen.add(kind)
        if not kind:
            errors.append(fe.required(path, "must not be empty"))
    return errors


def _queuing(queuing: Queuing, path: str) -> list[str]:
    errors: list[str] = []
    if queuing.queue_length_limit <= 0:
        errors.append(fe.invalid(f"{path}.queueLengthLimit", queuing.queue_length_limit, "must be positive"))
    if queuing.queues <= 0:
        errors.append(fe.invalid(f"{path}.queues", queuing.queues, "must be positive"))
    elif queuing.queues > MAX_QUEUES:
        errors.append(fe.invalid(f"{path}.queues", queuing.queues, f"must not be greater than {MAX_QUEUES}"))
    if queuing.hand_size <= 0:
        errors.append(fe.invalid(f"{path}.handSize", queuing.hand_size, "must be positive"))
    elif queuing.hand_size > queuing.queues:
        errors.append(
            fe.invalid(f"{path}.handSize", queuing.hand_size, f"should not be greater than queues ({queuing.queues})")
        )
    elif required_entropy_bits(queuing.queues, queuing.hand_size) > MAX_HASH_BITS:
        errors.append(
            fe.invalid(
                f"{path}.handSize",
                queuing.hand_size,
                f"required entropy bits of deckSize {queuing.queues} and handSize {queuing.hand_size} "
                f"should not be greater than {MAX_HASH_BITS}",
            )
        )
    return errors


def _spec(spec: PriorityLevelSpec, name: str) -> list[str]:
    """`ValidatePriorityLevelConfigurationSpec`."""
    errors: list[str] = []
    if (name == EXEMPT) != (spec.type == EXEMPT_TYPE):
        errors.append(fe.invalid("spec.type", spec.type, "type must be 'Exempt' if and only if name is 'exempt'"))
    if spec.type == EXEMPT_TYPE:
        if spec.limited is not None:
            errors.append(fe.forbidden("spec.limited", "must be nil if the type is not Limited"))
        if spec.exempt is not None:
            for key, value, detail in (
                ("nominalConcurrencyShares", spec.exempt.nominal_concurrency_shares, "must be a non-negative integer"),
                ("lendablePercent", spec.exempt.lendable_percent, "must be between 0 and 100, inclusive"),
            ):
                if value is not None and (value < 0 or (key == "lendablePercent" and value > 100)):
                    errors.append(fe.invalid(f"spec.exempt.{key}", value, detail))
    elif spec.type == LIMITED:
        if spec.exempt is not None:
            errors.append(fe.forbidden("spec.exempt", "must be nil if the type is Limited"))
        limited = spec.limited
        if limited is None:
            errors.append(fe.required("spec.limited", "must not be empty when type is Limited"))
        else:
            path = "spec.limited"
            if limited.nominal_concurrency_shares < 0:
                errors.append(
                    fe.invalid(
                        f"{path}.nominalConcurrencyShares", limited.nominal_concurrency_shares, "must be a non-negative integer"
                    )
                )
            response = limited.limit_response
            where = f"{path}.limitResponse"
            if response.type == REJECT:
                if response.queuing is not None:
                    errors.append(
                        fe.forbidden(f"{where}.queuing", "must be nil if limited.limitResponse.type is not Limited")
                    )
            elif response.type == QUEUE:
                if response.queuing is None:
                    errors.append(
                        fe.required(f"{where}.queuing", "must not be empty if limited.limitResponse.type is Limited")
                    )
                else:
                    errors += _queuing(response.queuing, f"{where}.queuing")
            else:
                listed = ", ".join(fe.go_quote(t) for t in SUPPORTED_LIMIT_RESPONSES)
                errors.append(f"{where}.type: {fe.UNSUPPORTED}: {fe.go_quote(response.type)}: supported values: {listed}")
            lendable = limited.lendable_percent
            if lendable is not None and not 0 <= lendable <= 100:
                errors.append(fe.invalid(f"{path}.lendablePercent", lendable, "must be between 0 and 100, inclusive"))
            borrowing = limited.borrowing_limit_percent
            if borrowing is not None and borrowing < 0:
                errors.append(
                    fe.invalid(f"{path}.borrowingLimitPercent", borrowing, "if specified, must be a non-negative integer")
                )
    else:
        listed = ", ".join(fe.go_quote(t) for t in SUPPORTED_TYPES)
        errors.append(f"spec.type: {fe.UNSUPPORTED}: {fe.go_quote(spec.type)}: supported values: {listed}")
    return errors


def validate_priority_level(pl: PriorityLevel, mandatory: PriorityLevel | None = None) -> list[str]:
    """`ValidatePriorityLevelConfiguration`; `mandatory` is the bootstrap object of the same name."""
    errors = validate_meta(pl.meta)
    if PRESERVE_ZERO_SHARES in pl.meta.annotations:
        errors.append(fe.forbidden("metadata.annotations", f"annotation '{PRESERVE_ZERO_SHARES}' is forbidden"))
    errors += _spec(pl.spec, pl.name)
    if mandatory is not None:
        if pl.name == EXEMPT:
            have = PriorityLevelSpec(pl.spec.type, pl.spec.limited, mandatory.spec.exempt)
            if have != mandatory.spec:
                errors.append(
                    _invalid_raw(
                        "spec", go_priority_level_spec(pl.spec), f"spec of '{pl.name}' except the 'spec.exempt' field must equal the fixed value"
                    )
                )
        elif pl.spec != mandatory.spec:
            errors.append(_invalid_raw("spec", go_priority_level_spec(pl.spec), f"spec of '{pl.name}' must equal the fixed value"))
    errors += _conditions(pl.conditions)
    return errors


# --- Go's %#v of a spec (without pointer addresses) -----------------------------------------------------


def _ptr(type_name: str, body: str | None) -> str:
    return f"(*{type_name})(nil)" if body is None else f"&{type_name}{body}"


def _int_ptr(value: int | None) -> str:
    return "(*int32)(nil)" if value is None else f"&{value}"


def go_flow_schema_spec(fs: FlowSchema) -> str:
    spec = fs.spec
    rules = ", ".join(
        "flowcontrol.PolicyRulesWithSubjects{Subjects:[]flowcontrol.Subject{"
        + ", ".join(
            f"flowcontrol.Subject{{Kind:{fe.go_quote(s.kind)}, User:{_ptr('flowcontrol.UserSubject', None if s.user is None else '{Name:' + fe.go_quote(s.user) + '}')}, "
            f"Group:{_ptr('flowcontrol.GroupSubject', None if s.group is None else '{Name:' + fe.go_quote(s.group) + '}')}, "
            f"ServiceAccount:{_ptr('flowcontrol.ServiceAccountSubject', None if s.service_account is None else '{Namespace:' + fe.go_quote(s.service_account[0]) + ', Name:' + fe.go_quote(s.service_account[1]) + '}')}}}"
            for s in r.subjects
        )
        + "}, ResourceRules:[]flowcontrol.ResourcePolicyRule{"
        + ", ".join(
            f"flowcontrol.ResourcePolicyRule{{Verbs:{go_strings(rr.verbs)}, APIGroups:{go_strings(rr.api_groups)}, "
            f"Resources:{go_strings(rr.resources)}, ClusterScope:{'true' if rr.cluster_scope else 'false'}, "
            f"Namespaces:{go_strings(rr.namespaces)}}}"
            for rr in r.resource_rules
        )
        + "}, NonResourceRules:[]flowcontrol.NonResourcePolicyRule{"
        + ", ".join(
            f"flowcontrol.NonResourcePolicyRule{{Verbs:{go_strings(nr.verbs)}, NonResourceURLs:{go_strings(nr.non_resource_urls)}}}"
            for nr in r.non_resource_rules
        )
        + "}}"
        for r in spec.rules
    )
    method = None if spec.distinguisher is None else "{Type:" + fe.go_quote(spec.distinguisher) + "}"
    return (
        f"flowcontrol.FlowSchemaSpec{{PriorityLevelConfiguration:flowcontrol.PriorityLevelConfigurationReference"
        f"{{Name:{fe.go_quote(spec.priority_level)}}}, MatchingPrecedence:{spec.matching_precedence}, "
        f"DistinguisherMethod:{_ptr('flowcontrol.FlowDistinguisherMethod', method)}, "
        f"Rules:[]flowcontrol.PolicyRulesWithSubjects{{{rules}}}}}"
    )


def go_priority_level_spec(spec: PriorityLevelSpec) -> str:
    limited = None
    if spec.limited is not None:
        lim = spec.limited
        q = lim.limit_response.queuing
        queuing = (
            None
            if q is None
            else f"{{Queues:{q.queues}, HandSize:{q.hand_size}, QueueLengthLimit:{q.queue_length_limit}}}"
        )
        limited = (
            f"{{NominalConcurrencyShares:{lim.nominal_concurrency_shares}, LimitResponse:flowcontrol.LimitResponse"
            f"{{Type:{fe.go_quote(lim.limit_response.type)}, Queuing:{_ptr('flowcontrol.QueuingConfiguration', queuing)}}}, "
            f"LendablePercent:{_int_ptr(lim.lendable_percent)}, BorrowingLimitPercent:{_int_ptr(lim.borrowing_limit_percent)}}}"
        )
    exempt = None
    if spec.exempt is not None:
        exempt = (
            f"{{NominalConcurrencyShares:{_int_ptr(spec.exempt.nominal_concurrency_shares)}, "
            f"LendablePercent:{_int_ptr(spec.exempt.lendable_percent)}}}"
        )
    return (
        f"flowcontrol.PriorityLevelConfigurationSpec{{Type:{fe.go_quote(spec.type)}, "
        f"Limited:{_ptr('flowcontrol.LimitedPriorityLevelConfiguration', limited)}, "
        f"Exempt:{_ptr('flowcontrol.ExemptPriorityLevelConfiguration', exempt)}}}"
    )
