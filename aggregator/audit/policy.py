"""The audit policy: which requests are audited at which level, in kube-apiserver's own file format.

`--audit-policy-file` holds an `audit.k8s.io/v1` `Policy`, read and checked like upstream's
`pkg/audit/policy/reader.go LoadPolicyFromBytes` (unknown fields only warn, as its lenient
fallback does; a wrong apiVersion or kind, an invalid rule or no rule at all is an error) and
`pkg/apis/audit/validation/validation.go ValidatePolicy`. A request is matched against the rules
in order by `pkg/audit/policy/checker.go EvaluatePolicyRule`: the first matching rule wins and no
match means level None. The policy's `omitStages` are added to every rule's.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aggregator.model import fielderrors as fe
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo

log = logging.getLogger(__name__)

API_VERSION = "audit.k8s.io/v1"


class Level(enum.Enum):
    """`audit.Level`, ordered None < Metadata < Request < RequestResponse."""

    NONE = "None"
    METADATA = "Metadata"
    REQUEST = "Request"
    REQUEST_RESPONSE = "RequestResponse"

    @property
    def rank(self) -> int:
        return _LEVEL_ORDER.index(self)

    def less(self, other: Level) -> bool:
        """`Level.Less`."""
        return self.rank < other.rank


_LEVEL_ORDER = (Level.NONE, Level.METADATA, Level.REQUEST, Level.REQUEST_RESPONSE)


class Stage(enum.Enum):
    """`audit.Stage`: when in a request's life an event is written."""

    REQUEST_RECEIVED = "RequestReceived"
    RESPONSE_STARTED = "ResponseStarted"
    RESPONSE_COMPLETE = "ResponseComplete"
    PANIC = "Panic"


class PolicyError(ValueError):
    """The policy cannot be used; `str()` is one line naming the problem (and the file, when read from one)."""


@dataclass(frozen=True, slots=True)
class GroupResources:
    group: str = ""
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyRule:
    level: Level
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    resources: tuple[GroupResources, ...] = ()
    namespaces: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    omit_stages: frozenset[Stage] = frozenset()
    omit_managed_fields: bool | None = None  # None: the policy's setting applies

    def matches(self, user: UserInfo | None, info: RequestInfo) -> bool:
        """`ruleMatches`: every non-empty field must match."""
        if self.users and (user is None or user.name not in self.users):
            return False
        if self.user_groups and (user is None or not any(g in self.user_groups for g in user.groups)):
            return False
        if self.verbs and info.verb not in self.verbs:
            return False
        if self.namespaces or self.resources:
            return self._matches_resource(info)
        if self.non_resource_urls:
            return not info.is_resource_request and any(
                _path_matches(info.path, spec) for spec in self.non_resource_urls
            )
        return True

    def _matches_resource(self, info: RequestInfo) -> bool:
        """`ruleMatchesResource`."""
        if not info.is_resource_request:
            return False
        # Cluster-scoped requests have the empty namespace, which a rule can list.
        if self.namespaces and info.namespace not in self.namespaces:
            return False
        if not self.resources:
            return True
        resource, sub = info.resource, info.subresource
        combined = f"{resource}/{sub}" if sub else resource
        for gr in self.resources:
            if gr.group not in (info.api_group, "*"):
                continue
            if not gr.resources:
                return True
            if gr.resource_names and info.name not in gr.resource_names:
                continue
            for res in gr.resources:
                if res in (combined, "*"):
                    return True
                if sub and res.startswith("*/") and sub == res[2:]:
                    return True
                # `res/*` also matches the resource itself, exactly as upstream.
                if res.endswith("/*") and resource == res[:-2]:
                    return True
        return False


def _path_matches(path: str, spec: str) -> bool:
    """`pathMatches`: `*`, an exact path, or a prefix when the spec ends in `*`."""
    if spec in ("*", path):
        return True
    return spec.endswith("*") and path.startswith(spec.rstrip("*"))


@dataclass(frozen=True, slots=True)
class RequestAuditConfig:
    """`audit.RequestAuditConfig`: what one request gets."""

    level: Level
    omit_stages: frozenset[Stage] = frozenset()
    omit_managed_fields: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[PolicyRule, ...]
    omit_stages: frozenset[Stage] = frozenset()
    omit_managed_fields: bool = False

    def evaluate(self, user: UserInfo | None, info: RequestInfo) -> RequestAuditConfig:
        """`EvaluatePolicyRule` (with `NewPolicyRuleEvaluator`'s union of omitted stages)."""
        for rule in self.rules:
            if rule.matches(user, info):
                omf = (
                    self.omit_managed_fields if rule.omit_managed_fields is None else rule.omit_managed_fields
                )
                return RequestAuditConfig(rule.level, rule.omit_stages | self.omit_stages, omf)
        return RequestAuditConfig(Level.NONE, self.omit_stages, self.omit_managed_fields)


# --- reading ------------------------------------------------------------------------------------

_POLICY_FIELDS = frozenset({"apiVersion", "kind", "metadata", "rules", "omitStages", "omitManagedFields"})
_RULE_FIELDS = frozenset(
    {
        "level",
        "users",
        "userGroups",
        "verbs",
        "resources",
        "namespaces",
        "nonResourceURLs",
        "omitStages",
        "omitManagedFields",
    }
)
_GROUP_RESOURCE_FIELDS = frozenset({"group", "resources", "resourceNames"})
_LEVEL_NAMES = [level.value for level in _LEVEL_ORDER]
_STAGE_NAMES = [stage.value for stage in Stage]


class _Decoder:
    """Typed field access over the YAML document, collecting unknown fields as upstream's strict
    decoder would report them (they only produce a warning)."""

    def __init__(self) -> None:
        self.unknown: list[str] = []

    def mapping(self, value: Any, path: str, known: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise PolicyError(f"failed decoding: {path or 'the document'}: expected an object")
        self.unknown.extend(f"{path}.{k}" if path else str(k) for k in value if k not in known)
        return value

    @staticmethod
    def strings(doc: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        value = doc.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PolicyError(f"failed decoding: {path}.{key}: expected a list of strings")
        return tuple(value)

    @staticmethod
    def string(doc: Mapping[str, Any], key: str, path: str) -> str:
        value = doc.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise PolicyError(f"failed decoding: {path}.{key}: expected a string")
        return value

    @staticmethod
    def boolean(doc: Mapping[str, Any], key: str, path: str) -> bool | None:
        value = doc.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise PolicyError(f"failed decoding: {path}.{key}: expected a boolean")
        return value


def _go_string_list(values: Sequence[str]) -> str:
    """How `field.Invalid` prints a `[]string` value (`%#v`)."""
    return "[]string{" + ", ".join(fe.go_quote(v) for v in values) + "}"


def _validate_stages(stages: tuple[str, ...], path: str, errs: list[str]) -> frozenset[Stage]:
    """`validateOmitStages`."""
    valid = []
    for i, name in enumerate(stages):
        if name in _STAGE_NAMES:
            valid.append(Stage(name))
        else:
            errs.append(fe.invalid(f"{path}[{i}]", name, "allowed stages are " + ",".join(_STAGE_NAMES)))
    return frozenset(valid)


def _validate_urls(urls: tuple[str, ...], path: str, errs: list[str]) -> None:
    """`validateNonResourceURLs`."""
    for i, url in enumerate(urls):
        if url == "*":
            continue
        if not url.startswith("/"):
            errs.append(
                fe.invalid(f"{path}[{i}]", url, "non-resource URL rules must begin with a '/' character")
            )
        if url and "*" in url[:-1]:
            errs.append(
                fe.invalid(
                    f"{path}[{i}]",
                    url,
                    "non-resource URL wildcards '*' must be the final character of the rule",
                )
            )


def _decode_group_resources(
    dec: _Decoder, value: Any, path: str, errs: list[str]
) -> tuple[GroupResources, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PolicyError(f"failed decoding: {path}: expected a list")
    out = []
    for i, entry in enumerate(value):
        item_path = f"{path}[{i}]"
        doc = dec.mapping(entry, item_path, _GROUP_RESOURCE_FIELDS)
        gr = GroupResources(
            dec.string(doc, "group", item_path),
            dec.strings(doc, "resources", item_path),
            dec.strings(doc, "resourceNames", item_path),
        )
        # `validateResources` reports these under the list's path, without an index.
        if gr.group and gr.group != "*" and (msgs := fe.is_dns1123_subdomain(gr.group)):
            errs.append(fe.invalid(f"{path}.group", gr.group, ",".join(msgs)))
        if gr.resource_names and not gr.resources:
            errs.append(
                _invalid_raw(
                    f"{path}.resourceNames",
                    _go_string_list(gr.resource_names),
                    "using resourceNames requires at least one resource",
                )
            )
        out.append(gr)
    return tuple(out)


def _invalid_raw(path: str, printed: str, detail: str) -> str:
    """`field.Invalid` for a value already printed the way `field.Error` prints it."""
    return f"{path}: {fe.INVALID}: {printed}: {detail}"


def _decode_rule(dec: _Decoder, value: Any, path: str, errs: list[str]) -> PolicyRule:
    """One `PolicyRule`, checked by `validatePolicyRule`."""
    doc = dec.mapping(value, path, _RULE_FIELDS)
    level_name = dec.string(doc, "level", path)
    if not level_name:
        errs.append(fe.required(f"{path}.level"))
        level = Level.NONE
    elif level_name not in _LEVEL_NAMES:
        errs.append(fe.unsupported(f"{path}.level", level_name, _LEVEL_NAMES))
        level = Level.NONE
    else:
        level = Level(level_name)
    urls = dec.strings(doc, "nonResourceURLs", path)
    _validate_urls(urls, f"{path}.nonResourceURLs", errs)
    resources = _decode_group_resources(dec, doc.get("resources"), f"{path}.resources", errs)
    stages = _validate_stages(dec.strings(doc, "omitStages", path), f"{path}.omitStages", errs)
    namespaces = dec.strings(doc, "namespaces", path)
    if urls and (resources or namespaces):
        errs.append(
            _invalid_raw(
                f"{path}.nonResourceURLs",
                _go_string_list(urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            )
        )
    return PolicyRule(
        level=level,
        users=dec.strings(doc, "users", path),
        user_groups=dec.strings(doc, "userGroups", path),
        verbs=dec.strings(doc, "verbs", path),
        resources=resources,
        namespaces=namespaces,
        non_resource_urls=urls,
        omit_stages=stages,
        omit_managed_fields=dec.boolean(doc, "omitManagedFields", path),
    )


def parse_policy(text: str | bytes) -> Policy:
    """`LoadPolicyFromBytes`: YAML or JSON text to a checked Policy, or PolicyError."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise PolicyError(f"failed decoding: {problem}") from err
    dec = _Decoder()
    doc = dec.mapping(document, "", _POLICY_FIELDS)
    api_version = dec.string(doc, "apiVersion", "")
    kind = dec.string(doc, "kind", "")
    if not api_version or not kind:
        missing = "apiVersion" if not api_version else "kind"
        raise PolicyError(f"failed decoding: Object {missing!r} is missing")
    if api_version != API_VERSION:
        raise PolicyError(f"unknown group version {api_version!r} in policy (supported: {API_VERSION})")
    if kind != "Policy":
        raise PolicyError(f'no kind "{kind}" is registered for version "{API_VERSION}"')
    errs: list[str] = []
    omit_stages = _validate_stages(dec.strings(doc, "omitStages", ""), "omitStages", errs)
    raw_rules = doc.get("rules")
    if raw_rules is not None and not isinstance(raw_rules, list):
        raise PolicyError("failed decoding: rules: expected a list")
    rules = tuple(_decode_rule(dec, rule, f"rules[{i}]", errs) for i, rule in enumerate(raw_rules or []))
    omit_managed_fields = dec.boolean(doc, "omitManagedFields", "") or False
    if errs:
        # `utilerrors.Aggregate`: a lone error as is, several in brackets.
        raise PolicyError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    if not rules:
        raise PolicyError("loaded illegal policy with 0 rules")
    if dec.unknown:
        log.warning(
            "audit policy contains errors, falling back to lenient decoding: unknown fields %s",
            ", ".join(dec.unknown),
        )
    return Policy(rules, omit_stages, omit_managed_fields)


def load_policy_file(path: str) -> Policy:
    """`LoadPolicyFromFile`: the error names the file."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise PolicyError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        return parse_policy(text)
    except PolicyError as err:
        raise PolicyError(f"{path}: {err}") from err
