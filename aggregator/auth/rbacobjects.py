"""RBAC manifests -> an `RBACPolicy`: decoding, kube-apiserver's validation, aggregation, built-ins.

- Decoding and validation follow `pkg/apis/rbac/v1/defaults.go` (a binding's `roleRef.apiGroup`
  and a User or Group subject's `apiGroup` default to rbac.authorization.k8s.io) and
  `pkg/apis/rbac/validation/validation.go` (`ValidateRole`, `ValidateClusterRole`,
  `ValidatePolicyRule`, `ValidateRoleBinding`, `ValidateClusterRoleBinding`,
  `ValidateRoleBindingSubject`), with apimachinery's messages: a refused object is reported as
  kube-apiserver would refuse it (`ClusterRole.rbac.authorization.k8s.io "x" is invalid: ...`).
  A namespaced object without a namespace is in `default` (as `kubectl apply` puts it); a
  cluster-scoped object's namespace is ignored (`rest.BeforeCreate`).
- A ClusterRole with an `aggregationRule` gets the rules of every ClusterRole its selectors match
  (by name order, without duplicates, never its own), as kube-controller-manager's
  `ClusterRoleAggregationController` writes them, repeated until nothing changes.
- The built-in roles every kube-apiserver has (`bootstrappolicy/policy.go`) are there too, so a
  folder that grants alice one resource does not also have to let her read discovery:
  `cluster-admin` (bound to system:masters), `system:discovery`, `system:basic-user` (may ask
  what it may do: SelfSubjectAccessReview), `system:public-info-viewer`, `system:monitoring`,
  and the `admin`, `edit` and `view` ClusterRoles that aggregate ClusterRoles labelled
  `rbac.authorization.k8s.io/aggregate-to-<name>: "true"` (without upstream's rules for the
  built-in resources, which the gateway does not serve). A folder object of the same kind and
  name replaces a built-in one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.auth.rbac import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    GROUP,
    GROUP_KIND,
    ROLE,
    ROLE_BINDING,
    SERVICE_ACCOUNT_KIND,
    USER_KIND,
    Binding,
    PolicyRule,
    RBACPolicy,
    RoleRef,
    Subject,
)
from aggregator.model import fielderrors as fe
from aggregator.model.decode import DecodeError, mapping, sequence
from aggregator.model.decode import field as decode_field
from aggregator.model.selectors import (
    DOES_NOT_EXIST,
    EQUALS,
    EXISTS,
    IN,
    NOT_IN,
    LabelRequirement,
    is_label_value,
    is_qualified_name,
)

API_VERSION = f"{GROUP}/v1"
KINDS = (ROLE, CLUSTER_ROLE, ROLE_BINDING, CLUSTER_ROLE_BINDING)
NAMESPACED = frozenset({ROLE, ROLE_BINDING})
DEFAULT_NAMESPACE = "default"
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"

# One label selector as requirements (all must match; none: everything).
Selector = tuple[LabelRequirement, ...]


@dataclass(frozen=True, slots=True)
class RoleObject:
    """A Role or ClusterRole as read (before aggregation)."""

    kind: str
    name: str
    rules: tuple[PolicyRule, ...]
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # ClusterRoles only: the aggregationRule's selectors (None: no aggregationRule).
    aggregation: tuple[Selector, ...] | None = None


RBACObject = RoleObject | Binding
ObjectKey = tuple[str, str, str]  # (kind, namespace, name)


def key_of(obj: RBACObject) -> ObjectKey:
    return (obj.kind, obj.namespace, obj.name)


def qualified(kind: str) -> str:
    return f"{kind}.{GROUP}"


class Refused(ValueError):
    """An RBAC manifest kube-apiserver would refuse; the message is its error, naming the field."""


def is_rbac(doc: Mapping[str, Any]) -> bool:
    """A document of the RBAC API group (any version): this module's business."""
    api_version = doc.get("apiVersion")
    return isinstance(api_version, str) and api_version.startswith(GROUP + "/") and doc.get("kind") in KINDS


# --- decoding ---------------------------------------------------------------------------------------


def _strings(obj: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
    values = sequence(obj, key, path)
    if not all(isinstance(v, str) for v in values):
        raise DecodeError(f"{path}: expected an array of strings")
    return tuple(values)


def _rule(item: Any, path: str) -> PolicyRule:
    if not isinstance(item, Mapping):
        raise DecodeError(f"{path}: expected object")
    return PolicyRule(
        verbs=_strings(item, "verbs", f"{path}.verbs"),
        api_groups=_strings(item, "apiGroups", f"{path}.apiGroups"),
        resources=_strings(item, "resources", f"{path}.resources"),
        resource_names=_strings(item, "resourceNames", f"{path}.resourceNames"),
        non_resource_urls=_strings(item, "nonResourceURLs", f"{path}.nonResourceURLs"),
    )


def _selector(item: Any, path: str, errors: list[str]) -> Selector:
    """`metav1.LabelSelectorAsSelector`, validated as `ValidateLabelSelector` does."""
    if not isinstance(item, Mapping):
        raise DecodeError(f"{path}: expected object")
    requirements: list[LabelRequirement] = []
    labels = mapping(item, "matchLabels", f"{path}.matchLabels")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise DecodeError(f"{path}.matchLabels[{key}]: expected string")
        if not is_qualified_name(str(key)):
            errors.append(fe.invalid(f"{path}.matchLabels", str(key), "must be a qualified name"))
        elif not is_label_value(value):
            errors.append(fe.invalid(f"{path}.matchLabels", value, "must be a valid label value"))
        requirements.append(LabelRequirement(str(key), EQUALS, (value,)))
    for i, expr in enumerate(sequence(item, "matchExpressions", f"{path}.matchExpressions")):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise DecodeError(f"{where}: expected object")
        key = decode_field(expr, "key", str, f"{where}.key", "")
        operator = decode_field(expr, "operator", str, f"{where}.operator", "")
        values = _strings(expr, "values", f"{where}.values")
        op = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}.get(operator)
        if op is None:
            errors.append(fe.invalid(f"{where}.operator", operator, "not a valid selector operator"))
            continue
        if op in (IN, NOT_IN) and not values:
            errors.append(
                fe.required(f"{where}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
        if op in (EXISTS, DOES_NOT_EXIST) and values:
            errors.append(
                fe.forbidden(
                    f"{where}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                )
            )
        if not is_qualified_name(key):
            errors.append(fe.invalid(f"{where}.key", key, "must be a qualified name"))
        requirements.append(LabelRequirement(key, op, tuple(sorted(set(values)))))
    return tuple(requirements)


def _meta(doc: Mapping[str, Any], kind: str, errors: list[str]) -> tuple[str, str, dict[str, str]]:
    """(namespace, name, labels), with `ValidateObjectMeta`'s checks on the name and namespace."""
    metadata = mapping(doc, "metadata", "metadata")
    name = decode_field(metadata, "name", str, "metadata.name", "")
    namespace = decode_field(metadata, "namespace", str, "metadata.namespace", "")
    labels = mapping(metadata, "labels", "metadata.labels")
    if not all(isinstance(v, str) for v in labels.values()):
        raise DecodeError("metadata.labels: expected string values")
    if not name:
        errors.append(fe.required("metadata.name", "name or generateName is required"))
    errors.extend(
        fe.invalid("metadata.name", name, msg) for msg in fe.is_valid_path_segment_name(name) if name
    )
    if kind in NAMESPACED:
        namespace = namespace or DEFAULT_NAMESPACE
        errors.extend(
            fe.invalid("metadata.namespace", namespace, msg) for msg in fe.is_dns1123_label(namespace)
        )
    else:
        namespace = ""
    return namespace, name, {str(k): str(v) for k, v in labels.items()}


def _validate_rule(rule: PolicyRule, namespaced: bool, path: str) -> list[str]:
    """`ValidatePolicyRule`."""
    errors: list[str] = []
    if not rule.verbs:
        errors.append(fe.required(f"{path}.verbs", "verbs must contain at least one value"))
    if rule.non_resource_urls:
        urls = _go_slice(rule.non_resource_urls)
        if namespaced:
            errors.append(
                f"{path}.nonResourceURLs: {fe.INVALID}: {urls}: namespaced rules cannot apply to non-resource URLs"
            )
        if rule.api_groups or rule.resources or rule.resource_names:
            errors.append(
                f"{path}.nonResourceURLs: {fe.INVALID}: {urls}: "
                "rules cannot apply to both regular resources and non-resource URLs"
            )
        return errors
    if not rule.api_groups:
        errors.append(fe.required(f"{path}.apiGroups", "resource rules must supply at least one api group"))
    if not rule.resources:
        errors.append(fe.required(f"{path}.resources", "resource rules must supply at least one resource"))
    return errors


def _go_slice(values: tuple[str, ...]) -> str:
    """Go's `%#v` of a []string, as field.Invalid prints one."""
    return "[]string{" + ", ".join(fe.go_quote(v) for v in values) + "}"


def _role(doc: Mapping[str, Any], kind: str) -> RoleObject:
    errors: list[str] = []
    namespace, name, labels = _meta(doc, kind, errors)
    rules = tuple(_rule(item, f"rules[{i}]") for i, item in enumerate(sequence(doc, "rules", "rules")))
    for i, rule in enumerate(rules):
        errors += _validate_rule(rule, kind == ROLE, f"rules[{i}]")
    aggregation: tuple[Selector, ...] | None = None
    raw = doc.get("aggregationRule")
    if kind == CLUSTER_ROLE and raw is not None:
        rule_map = mapping(doc, "aggregationRule", "aggregationRule")
        selectors = sequence(rule_map, "clusterRoleSelectors", "aggregationRule.clusterRoleSelectors")
        if not selectors:
            errors.append(
                fe.required(
                    "aggregationRule.clusterRoleSelectors",
                    "at least one clusterRoleSelector required if aggregationRule is non-nil",
                )
            )
        aggregation = tuple(
            _selector(item, f"aggregationRule.clusterRoleSelectors[{i}]", errors)
            for i, item in enumerate(selectors)
        )
    if errors:
        raise Refused(fe.invalid_object(qualified(kind), name, errors))
    return RoleObject(kind, name, rules, namespace, labels, aggregation)


def _subject(item: Any, namespaced: bool, path: str) -> tuple[Subject, list[str]]:
    """A subject with `SetDefaults_Subject` applied, and `ValidateRoleBindingSubject`'s errors."""
    if not isinstance(item, Mapping):
        raise DecodeError(f"{path}: expected object")
    kind = decode_field(item, "kind", str, f"{path}.kind", "")
    name = decode_field(item, "name", str, f"{path}.name", "")
    namespace = decode_field(item, "namespace", str, f"{path}.namespace", "")
    api_group = decode_field(item, "apiGroup", str, f"{path}.apiGroup", "")
    if not api_group and kind in (USER_KIND, GROUP_KIND):
        api_group = GROUP
    errors: list[str] = []
    if not name:
        errors.append(fe.required(f"{path}.name"))
    if kind == SERVICE_ACCOUNT_KIND:
        if name:
            errors.extend(fe.invalid(f"{path}.name", name, msg) for msg in fe.is_dns1123_subdomain(name))
        if api_group:
            errors.append(fe.unsupported(f"{path}.apiGroup", api_group, [""]))
        if not namespaced and not namespace:
            errors.append(fe.required(f"{path}.namespace"))
    elif kind in (USER_KIND, GROUP_KIND):
        if api_group != GROUP:
            errors.append(fe.unsupported(f"{path}.apiGroup", api_group, [GROUP]))
    else:
        errors.append(fe.unsupported(f"{path}.kind", kind, [SERVICE_ACCOUNT_KIND, USER_KIND, GROUP_KIND]))
    return Subject(kind, name, namespace), errors


def _binding(doc: Mapping[str, Any], kind: str) -> Binding:
    errors: list[str] = []
    namespace, name, _labels = _meta(doc, kind, errors)
    ref = mapping(doc, "roleRef", "roleRef")
    ref_group = decode_field(ref, "apiGroup", str, "roleRef.apiGroup", "") or GROUP
    ref_kind = decode_field(ref, "kind", str, "roleRef.kind", "")
    ref_name = decode_field(ref, "name", str, "roleRef.name", "")
    if ref_group != GROUP:
        errors.append(fe.unsupported("roleRef.apiGroup", ref_group, [GROUP]))
    allowed = [ROLE, CLUSTER_ROLE] if kind == ROLE_BINDING else [CLUSTER_ROLE]
    if ref_kind not in allowed:
        errors.append(fe.unsupported("roleRef.kind", ref_kind, allowed))
    if not ref_name:
        errors.append(fe.required("roleRef.name"))
    errors.extend(
        fe.invalid("roleRef.name", ref_name, msg)
        for msg in fe.is_valid_path_segment_name(ref_name)
        if ref_name
    )
    subjects = []
    for i, item in enumerate(sequence(doc, "subjects", "subjects")):
        subject, problems = _subject(item, kind == ROLE_BINDING, f"subjects[{i}]")
        subjects.append(subject)
        errors += problems
    if errors:
        raise Refused(fe.invalid_object(qualified(kind), name, errors))
    return Binding(kind, name, RoleRef(ref_kind, ref_name), tuple(subjects), namespace)


def decode(doc: Mapping[str, Any]) -> RBACObject:
    """One RBAC document (`is_rbac`) -> its object. Raises Refused with kube-apiserver's message."""
    api_version, kind = doc.get("apiVersion"), str(doc.get("kind"))
    if api_version != API_VERSION:
        raise Refused(f"{api_version} {kind} is not served (removed in Kubernetes 1.22); use {API_VERSION}")
    try:
        if kind in (ROLE, CLUSTER_ROLE):
            return _role(doc, kind)
        return _binding(doc, kind)
    except DecodeError as err:
        metadata = doc.get("metadata")
        name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
        raise Refused(f"{qualified(kind)} {fe.go_quote(str(name))} could not be decoded: {err}") from err


# --- the built-in roles (bootstrappolicy/policy.go) -------------------------------------------------


def _cluster_role(name: str, *rules: PolicyRule, labels: Mapping[str, str] | None = None) -> RoleObject:
    return RoleObject(CLUSTER_ROLE, name, rules, labels=labels or {})


def _aggregated(name: str, *, into: str = "") -> RoleObject:
    """`admin`, `edit`, `view`: ClusterRoles made of those labelled aggregate-to-<name>."""
    selector = (LabelRequirement(AGGREGATE_TO + name, EQUALS, ("true",)),)
    labels = {AGGREGATE_TO + into: "true"} if into else {}
    return RoleObject(CLUSTER_ROLE, name, (), labels=labels, aggregation=(selector,))


def _group_binding(role: str, *groups: str) -> Binding:
    return Binding(
        CLUSTER_ROLE_BINDING, role, RoleRef(CLUSTER_ROLE, role), tuple(Subject(GROUP_KIND, g) for g in groups)
    )


_HEALTH = ("/livez", "/readyz", "/healthz")
BUILTIN: tuple[RBACObject, ...] = (
    _cluster_role(
        "cluster-admin",
        PolicyRule(verbs=("*",), api_groups=("*",), resources=("*",)),
        PolicyRule(verbs=("*",), non_resource_urls=("*",)),
    ),
    _cluster_role(
        "system:discovery",
        PolicyRule(
            verbs=("get",),
            non_resource_urls=(
                *_HEALTH,
                "/version",
                "/version/",
                "/openapi",
                "/openapi/*",
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
            ),
        ),
    ),
    _cluster_role(
        "system:monitoring",
        PolicyRule(
            verbs=("get",),
            non_resource_urls=("/metrics", "/metrics/slis", *_HEALTH, "/livez/*", "/readyz/*", "/healthz/*"),
        ),
    ),
    _cluster_role(
        "system:basic-user",
        PolicyRule(
            verbs=("create",),
            api_groups=("authorization.k8s.io",),
            resources=("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
        ),
        PolicyRule(
            verbs=("create",), api_groups=("authentication.k8s.io",), resources=("selfsubjectreviews",)
        ),
    ),
    _cluster_role(
        "system:public-info-viewer",
        PolicyRule(verbs=("get",), non_resource_urls=(*_HEALTH, "/version", "/version/")),
    ),
    _aggregated("admin"),
    _aggregated("edit", into="admin"),
    _aggregated("view", into="edit"),
    _group_binding("cluster-admin", "system:masters"),
    _group_binding("system:monitoring", "system:monitoring"),
    _group_binding("system:discovery", "system:authenticated"),
    _group_binding("system:basic-user", "system:authenticated"),
    _group_binding("system:public-info-viewer", "system:authenticated", "system:unauthenticated"),
)


# --- the policy -------------------------------------------------------------------------------------


def _matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    return all(requirement.matches(labels) for requirement in selector)


def aggregate_cluster_roles(cluster_roles: dict[str, RoleObject]) -> dict[str, tuple[PolicyRule, ...]]:
    """Every ClusterRole's rules once the aggregation controller has settled."""
    rules = {name: role.rules for name, role in cluster_roles.items()}
    aggregating = sorted(name for name, role in cluster_roles.items() if role.aggregation is not None)
    ordered = sorted(cluster_roles.values(), key=lambda r: r.name)
    # Each pass is one sync of every aggregated role; chains settle in at most len(aggregating) passes.
    for _ in range(len(aggregating) + 1):
        changed = False
        for name in aggregating:
            gathered: list[PolicyRule] = []
            for selector in cluster_roles[name].aggregation or ():
                for other in ordered:
                    if other.name == name or not _matches(selector, other.labels):
                        continue
                    gathered += [rule for rule in rules[other.name] if rule not in gathered]
            if tuple(gathered) != rules[name]:
                rules[name] = tuple(gathered)
                changed = True
        if not changed:
            break
    return rules


def compile_policy(objects: Iterable[RBACObject], *, present: bool) -> RBACPolicy:
    """The policy for these folder objects plus the built-ins (a folder object replaces its
    built-in namesake)."""
    merged: dict[ObjectKey, RBACObject] = {key_of(obj): obj for obj in BUILTIN}
    counts: Counter[str] = Counter()
    for obj in objects:
        merged[key_of(obj)] = obj
        counts[obj.kind] += 1
    cluster_roles: dict[str, RoleObject] = {}
    roles: dict[tuple[str, str], tuple[PolicyRule, ...]] = {}
    cluster_bindings: list[Binding] = []
    role_bindings: dict[str, list[Binding]] = {}
    for obj in merged.values():
        if isinstance(obj, RoleObject):
            if obj.kind == CLUSTER_ROLE:
                cluster_roles[obj.name] = obj
            else:
                roles[(obj.namespace, obj.name)] = obj.rules
        elif obj.kind == CLUSTER_ROLE_BINDING:
            cluster_bindings.append(obj)
        else:
            role_bindings.setdefault(obj.namespace, []).append(obj)
    return RBACPolicy(
        cluster_roles=aggregate_cluster_roles(cluster_roles),
        roles=roles,
        # Listers return bindings in no particular order; by name, so the reason is stable.
        cluster_role_bindings=tuple(sorted(cluster_bindings, key=lambda b: b.name)),
        role_bindings={ns: tuple(sorted(bs, key=lambda b: b.name)) for ns, bs in role_bindings.items()},
        present=present,
        counts=dict(counts),
    )
