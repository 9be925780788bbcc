"""`flowcontrol.apiserver.k8s.io/v1` FlowSchema and PriorityLevelConfiguration, decoded and defaulted.

The types mirror `k8s.io/api/flowcontrol/v1/types.go`; decoding applies the v1 defaults
(`pkg/apis/flowcontrol/v1/defaults.go`: matchingPrecedence 1000, nominalConcurrencyShares 30 for a
Limited level and 0 for the exempt one, lendablePercent 0, queues 64, handSize 8,
queueLengthLimit 50), as kube-apiserver stores them, so two objects that kube-apiserver would
store alike compare equal here. A field of the wrong type is a `DecodeError` naming the field, as
Go's decoder refuses it; a field the kind does not have is found by `unknown_fields` with
`FLOW_SCHEMA_FIELDS` / `PRIORITY_LEVEL_FIELDS` (what `kubectl apply`'s strict validation refuses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.model.decode import DecodeError, each, int32, mapping, sequence
from aggregator.model.decode import field as decode_field
from aggregator.model.strict import OBJECT_META, Fields, ListOf

GROUP = "flowcontrol.apiserver.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
FLOW_SCHEMA = "FlowSchema"
PRIORITY_LEVEL = "PriorityLevelConfiguration"

# k8s.io/api/flowcontrol/v1/types.go
AUTO_UPDATE_ANNOTATION = "apf.kubernetes.io/autoupdate-spec"
EXEMPT = "exempt"  # the mandatory exempt FlowSchema and priority level
CATCH_ALL = "catch-all"  # the mandatory catch-all FlowSchema and priority level
LIMITED = "Limited"
EXEMPT_TYPE = "Exempt"
REJECT = "Reject"
QUEUE = "Queue"
BY_USER = "ByUser"
BY_NAMESPACE = "ByNamespace"
USER = "User"
GROUP_KIND = "Group"
SERVICE_ACCOUNT = "ServiceAccount"
NAME_ALL = "*"
MAX_MATCHING_PRECEDENCE = 10000

# pkg/apis/flowcontrol/v1/defaults.go
DEFAULT_MATCHING_PRECEDENCE = 1000
DEFAULT_HAND_SIZE = 8
DEFAULT_QUEUES = 64
DEFAULT_QUEUE_LENGTH_LIMIT = 50
DEFAULT_NOMINAL_CONCURRENCY_SHARES = 30


@dataclass(frozen=True, slots=True)
class Subject:
    """`Subject`: exactly one of `user`, `group`, `service_account` is set when valid; all three are
    kept as given so validation can say which one is wrong."""

    kind: str
    user: str | None = None  # UserSubject.name
    group: str | None = None  # GroupSubject.name
    service_account: tuple[str, str] | None = None  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ResourceRule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    cluster_scope: bool = False
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NonResourceRule:
    verbs: tuple[str, ...]
    non_resource_urls: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PolicyRules:
    """`PolicyRulesWithSubjects`."""

    subjects: tuple[Subject, ...]
    resource_rules: tuple[ResourceRule, ...] = ()
    non_resource_rules: tuple[NonResourceRule, ...] = ()


@dataclass(frozen=True, slots=True)
class FlowSchemaSpec:
    priority_level: str
    matching_precedence: int = DEFAULT_MATCHING_PRECEDENCE
    distinguisher: str | None = None  # FlowDistinguisherMethod.type; None: no method
    rules: tuple[PolicyRules, ...] = ()


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str = ""
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Meta:
    """The ObjectMeta fields APF reads: the UID goes into the response headers."""

    name: str
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    namespace: str = ""  # only to say it is ignored: both kinds are cluster-scoped


@dataclass(frozen=True, slots=True)
class Named:
    """What both kinds share: their metadata, read by name and UID."""

    meta: Meta

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def uid(self) -> str:
        return self.meta.uid


@dataclass(frozen=True, slots=True)
class FlowSchema(Named):
    spec: FlowSchemaSpec
    conditions: tuple[Condition, ...] = ()



@dataclass(frozen=True, slots=True)
class Queuing:
    queues: int = DEFAULT_QUEUES
    hand_size: int = DEFAULT_HAND_SIZE
    queue_length_limit: int = DEFAULT_QUEUE_LENGTH_LIMIT


@dataclass(frozen=True, slots=True)
class LimitResponse:
    type: str
    queuing: Queuing | None = None


@dataclass(frozen=True, slots=True)
class Limited:
    nominal_concurrency_shares: int = DEFAULT_NOMINAL_CONCURRENCY_SHARES
    limit_response: LimitResponse = LimitResponse(REJECT)
    lendable_percent: int | None = 0
    borrowing_limit_percent: int | None = None


@dataclass(frozen=True, slots=True)
class Exempt:
    nominal_concurrency_shares: int | None = 0
    lendable_percent: int | None = 0


@dataclass(frozen=True, slots=True)
class PriorityLevelSpec:
    type: str
    limited: Limited | None = None
    exempt: Exempt | None = None


@dataclass(frozen=True, slots=True)
class PriorityLevel(Named):
    """`PriorityLevelConfiguration`."""

    spec: PriorityLevelSpec
    conditions: tuple[Condition, ...] = ()


    @property
    def is_exempt(self) -> bool:
        return self.spec.type == EXEMPT_TYPE

    @property
    def queuing(self) -> Queuing | None:
        """The queuing configuration of a Limited level that queues; None otherwise."""
        limited = self.spec.limited
        if limited is None or limited.limit_response.type != QUEUE:
            return None
        return limited.limit_response.queuing

    def shares(self) -> tuple[int, int | None, int | None]:
        """`plSpecCommons`: (nominalConcurrencyShares, lendablePercent, borrowingLimitPercent)."""
        limited = self.spec.limited
        if limited is not None:
            return limited.nominal_concurrency_shares, limited.lendable_percent, limited.borrowing_limit_percent
        exempt = self.spec.exempt or Exempt(None, None)
        return exempt.nominal_concurrency_shares or 0, exempt.lendable_percent, None


Object = FlowSchema | PriorityLevel


# --- strict field validation ------------------------------------------------------------------------

_CONDITIONS = ListOf(dict.fromkeys(("type", "status", "lastTransitionTime", "reason", "message")))
_SUBJECT: Fields = {
    "kind": None,
    "user": {"name": None},
    "group": {"name": None},
    "serviceAccount": {"namespace": None, "name": None},
}
FLOW_SCHEMA_FIELDS: Fields = {
    "apiVersion": None,
    "kind": None,
    "metadata": OBJECT_META,
    "spec": {
        "priorityLevelConfiguration": {"name": None},
        "matchingPrecedence": None,
        "distinguisherMethod": {"type": None},
        "rules": ListOf(
            {
                "subjects": ListOf(_SUBJECT),
                "resourceRules": ListOf(dict.fromkeys(("verbs", "apiGroups", "resources", "clusterScope", "namespaces"))),
                "nonResourceRules": ListOf(dict.fromkeys(("verbs", "nonResourceURLs"))),
            }
        ),
    },
    "status": {"conditions": _CONDITIONS},
}
PRIORITY_LEVEL_FIELDS: Fields = {
    "apiVersion": None,
    "kind": None,
    "metadata": OBJECT_META,
    "spec": {
        "type": None,
        "limited": {
            "nominalConcurrencyShares": None,
            "limitResponse": {
                "type": None,
                "queuing": dict.fromkeys(("queues", "handSize", "queueLengthLimit")),
            },
            "lendablePercent": None,
            "borrowingLimitPercent": None,
        },
        "exempt": dict.fromkeys(("nominalConcurrencyShares", "lendablePercent")),
    },
    "status": {"conditions": _CONDITIONS},
}


# --- decoding ---------------------------------------------------------------------------------------


def _strings(obj: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
    values = sequence(obj, key, path)
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise DecodeError(f"{path}[{index}]: expected string, got {type(value).__name__}")
    return tuple(values)


def _object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DecodeError(f"{path}: expected object, got {type(value).__name__}")
    return value


def _optional(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    """A pointer to a struct: absent or null is nil."""
    value = obj.get(key)
    return None if value is None else _object(value, path)


def decode_meta(doc: Mapping[str, Any]) -> Meta:
    metadata = mapping(doc, "metadata", "metadata")
    annotations = mapping(metadata, "annotations", "metadata.annotations")
    if not all(isinstance(v, str) for v in annotations.values()):
        raise DecodeError("metadata.annotations: expected string values")
    generation = decode_field(metadata, "generation", int, "metadata.generation", 0)
    return Meta(
        name=decode_field(metadata, "name", str, "metadata.name", ""),
        uid=decode_field(metadata, "uid", str, "metadata.uid", ""),
        resource_version=decode_field(metadata, "resourceVersion", str, "metadata.resourceVersion", ""),
        generation=generation,
        annotations={str(k): str(v) for k, v in annotations.items()},
        namespace=decode_field(metadata, "namespace", str, "metadata.namespace", ""),
    )


def _conditions(doc: Mapping[str, Any]) -> tuple[Condition, ...]:
    return each(mapping(doc, "status", "status"), "conditions", "status.conditions", _condition)


def _condition(item: Any, path: str) -> Condition:
    cond = _object(item, path)
    return Condition(
        decode_field(cond, "type", str, f"{path}.type", ""),
        decode_field(cond, "status", str, f"{path}.status", ""),
        decode_field(cond, "reason", str, f"{path}.reason", ""),
        decode_field(cond, "message", str, f"{path}.message", ""),
    )


def _subject(item: Any, path: str) -> Subject:
    obj = _object(item, path)
    user = _optional(obj, "user", f"{path}.user")
    group = _optional(obj, "group", f"{path}.group")
    account = _optional(obj, "serviceAccount", f"{path}.serviceAccount")
    return Subject(
        kind=decode_field(obj, "kind", str, f"{path}.kind", ""),
        user=None if user is None else decode_field(user, "name", str, f"{path}.user.name", ""),
        group=None if group is None else decode_field(group, "name", str, f"{path}.group.name", ""),
        service_account=None
        if account is None
        else (
            decode_field(account, "namespace", str, f"{path}.serviceAccount.namespace", ""),
            decode_field(account, "name", str, f"{path}.serviceAccount.name", ""),
        ),
    )


def _resource_rule(item: Any, path: str) -> ResourceRule:
    rule = _object(item, path)
    return ResourceRule(
        verbs=_strings(rule, "verbs", f"{path}.verbs"),
        api_groups=_strings(rule, "apiGroups", f"{path}.apiGroups"),
        resources=_strings(rule, "resources", f"{path}.resources"),
        cluster_scope=decode_field(rule, "clusterScope", bool, f"{path}.clusterScope", False),
        namespaces=_strings(rule, "namespaces", f"{path}.namespaces"),
    )


def _non_resource_rule(item: Any, path: str) -> NonResourceRule:
    rule = _object(item, path)
    return NonResourceRule(
        verbs=_strings(rule, "verbs", f"{path}.verbs"),
        non_resource_urls=_strings(rule, "nonResourceURLs", f"{path}.nonResourceURLs"),
    )


def _rules(item: Any, path: str) -> PolicyRules:
    obj = _object(item, path)
    return PolicyRules(
        each(obj, "subjects", f"{path}.subjects", _subject),
        each(obj, "resourceRules", f"{path}.resourceRules", _resource_rule),
        each(obj, "nonResourceRules", f"{path}.nonResourceRules", _non_resource_rule),
    )


def decode_flow_schema(doc: Mapping[str, Any]) -> FlowSchema:
    """A FlowSchema with v1's defaults; DecodeError for a field of the wrong type."""
    meta = decode_meta(doc)
    spec = mapping(doc, "spec", "spec")
    reference = mapping(spec, "priorityLevelConfiguration", "spec.priorityLevelConfiguration")
    method = _optional(spec, "distinguisherMethod", "spec.distinguisherMethod")
    precedence = int32(spec, "matchingPrecedence", "spec.matchingPrecedence", 0) or DEFAULT_MATCHING_PRECEDENCE
    return FlowSchema(
        meta,
        FlowSchemaSpec(
            priority_level=decode_field(reference, "name", str, "spec.priorityLevelConfiguration.name", ""),
            matching_precedence=precedence,
            distinguisher=None
            if method is None
            else decode_field(method, "type", str, "spec.distinguisherMethod.type", ""),
            rules=each(spec, "rules", "spec.rules", _rules),
        ),
        _conditions(doc),
    )


def _queuing(obj: Mapping[str, Any], path: str) -> Queuing:
    """`SetDefaults_QueuingConfiguration`: a zero (or absent) field takes its default."""
    return Queuing(
        queues=int32(obj, "queues", f"{path}.queues", 0) or DEFAULT_QUEUES,
        hand_size=int32(obj, "handSize", f"{path}.handSize", 0) or DEFAULT_HAND_SIZE,
        queue_length_limit=int32(obj, "queueLengthLimit", f"{path}.queueLengthLimit", 0) or DEFAULT_QUEUE_LENGTH_LIMIT,
    )


def decode_priority_level(doc: Mapping[str, Any]) -> PriorityLevel:
    """A PriorityLevelConfiguration with v1's defaults; DecodeError for a field of the wrong type."""
    meta = decode_meta(doc)
    spec = mapping(doc, "spec", "spec")
    limited_doc = _optional(spec, "limited", "spec.limited")
    exempt_doc = _optional(spec, "exempt", "spec.exempt")
    limited: Limited | None = None
    if limited_doc is not None:
        path = "spec.limited"
        response = mapping(limited_doc, "limitResponse", f"{path}.limitResponse")
        queuing_doc = _optional(response, "queuing", f"{path}.limitResponse.queuing")
        shares = int32(limited_doc, "nominalConcurrencyShares", f"{path}.nominalConcurrencyShares")
        lendable = int32(limited_doc, "lendablePercent", f"{path}.lendablePercent")
        limited = Limited(
            nominal_concurrency_shares=DEFAULT_NOMINAL_CONCURRENCY_SHARES if shares is None else shares,
            limit_response=LimitResponse(
                decode_field(response, "type", str, f"{path}.limitResponse.type", ""),
                None if queuing_doc is None else _queuing(queuing_doc, f"{path}.limitResponse.queuing"),
            ),
            lendable_percent=0 if lendable is None else lendable,
            borrowing_limit_percent=int32(limited_doc, "borrowingLimitPercent", f"{path}.borrowingLimitPercent"),
        )
    exempt: Exempt | None = None
    if exempt_doc is not None:
        shares = int32(exempt_doc, "nominalConcurrencyShares", "spec.exempt.nominalConcurrencyShares")
        lendable = int32(exempt_doc, "lendablePercent", "spec.exempt.lendablePercent")
        exempt = Exempt(0 if shares is None else shares, 0 if lendable is None else lendable)
    return PriorityLevel(
        meta,
        PriorityLevelSpec(decode_field(spec, "type", str, "spec.type", ""), limited, exempt),
        _conditions(doc),
    )
