"""kube-apiserver's bootstrap APF configuration, and what its ensurer makes of a set of objects.

The objects are `k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap/default.go`'s, in the same order:
the mandatory `exempt` and `catch-all` (FlowSchema and priority level each) and the suggested ones
(`system`, `node-high`, `leader-election`, `workload-high`, `workload-low`, `global-default`, and
the FlowSchemas that reference them). Every one carries `apf.kubernetes.io/autoupdate-spec: "true"`.

`ensure` is kube-apiserver's `bootstrapConfigurationEnsurer` applied to a set of objects at once
(`pkg/registry/flowcontrol/ensurer`, `rest/storage_flowcontrol.go ensure`): a missing suggested or
mandatory object is created; a present mandatory one gets the bootstrap spec unless its spec is
equal(ish) already; a present suggested one gets it if its auto-update annotation says `true` (or
it has none and was never updated: generation 1, which a manifest read from a folder is); an
object that is not a bootstrap one but says `autoupdate-spec: "true"` is deleted. In local mode the
folder's objects go through it, so the gateway applies what kube-apiserver would serve after
starting on them; in kube mode kube-apiserver has already done it and the cluster's objects are used
as listed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace

from aggregator.flowcontrol.objects import (
    AUTO_UPDATE_ANNOTATION,
    BY_NAMESPACE,
    BY_USER,
    CATCH_ALL,
    EXEMPT,
    EXEMPT_TYPE,
    GROUP_KIND,
    LIMITED,
    NAME_ALL,
    QUEUE,
    REJECT,
    SERVICE_ACCOUNT,
    USER,
    Exempt,
    FlowSchema,
    FlowSchemaSpec,
    Limited,
    LimitResponse,
    Meta,
    NonResourceRule,
    Object,
    PolicyRules,
    PriorityLevel,
    PriorityLevelSpec,
    Queuing,
    ResourceRule,
    Subject,
)

_ALL = ("*",)
_AUTO_UPDATE = {AUTO_UPDATE_ANNOTATION: "true"}
# The namespace of the UIDs this gateway gives objects that have none (local mode): deterministic,
# so every worker and every restart sends the same `X-Kubernetes-PF-*-UID` for the same object.
UID_NAMESPACE = uuid.UUID("7b4a1c36-2f44-5a0e-9d3c-6f1b0e3a8c52")


def _groups(*names: str) -> tuple[Subject, ...]:
    return tuple(Subject(GROUP_KIND, group=name) for name in names)


def _users(*names: str) -> tuple[Subject, ...]:
    return tuple(Subject(USER, user=name) for name in names)


def _kube_system_accounts(*names: str) -> tuple[Subject, ...]:
    return tuple(Subject(SERVICE_ACCOUNT, service_account=("kube-system", name)) for name in names)


def _resources(verbs: tuple[str, ...], groups: tuple[str, ...], resources: tuple[str, ...], cluster: bool) -> ResourceRule:
    return ResourceRule(verbs, groups, resources, cluster, _ALL)


def _everything(subjects: tuple[Subject, ...]) -> PolicyRules:
    return PolicyRules(
        subjects, (_resources(_ALL, _ALL, _ALL, True),), (NonResourceRule(_ALL, _ALL),)
    )


def _level(name: str, spec: PriorityLevelSpec) -> PriorityLevel:
    return PriorityLevel(Meta(name, annotations=_AUTO_UPDATE), spec)


def _queued(shares: int, lendable: int, queues: int, hand_size: int) -> PriorityLevelSpec:
    return PriorityLevelSpec(
        LIMITED, Limited(shares, LimitResponse(QUEUE, Queuing(queues, hand_size, 50)), lendable, None)
    )


def _schema(name: str, level: str, precedence: int, method: str | None, *rules: PolicyRules) -> FlowSchema:
    return FlowSchema(Meta(name, annotations=_AUTO_UPDATE), FlowSchemaSpec(level, precedence, method, rules))


# --- mandatory --------------------------------------------------------------------------------------

EXEMPT_LEVEL = _level(EXEMPT, PriorityLevelSpec(EXEMPT_TYPE, exempt=Exempt(0, 0)))
CATCH_ALL_LEVEL = _level(CATCH_ALL, PriorityLevelSpec(LIMITED, Limited(5, LimitResponse(REJECT), 0, None)))
EXEMPT_SCHEMA = _schema(EXEMPT, EXEMPT, 1, None, _everything(_groups("system:masters")))
CATCH_ALL_SCHEMA = _schema(
    CATCH_ALL, CATCH_ALL, 10000, BY_USER, _everything(_groups("system:unauthenticated", "system:authenticated"))
)
MANDATORY_LEVELS = (CATCH_ALL_LEVEL, EXEMPT_LEVEL)
MANDATORY_SCHEMAS = (EXEMPT_SCHEMA, CATCH_ALL_SCHEMA)

# --- suggested --------------------------------------------------------------------------------------

SUGGESTED_LEVELS = (
    _level("system", _queued(30, 33, 64, 6)),
    _level("node-high", _queued(40, 25, 64, 6)),
    _level("leader-election", _queued(10, 0, 16, 4)),
    _level("workload-high", _queued(40, 50, 128, 6)),
    _level("workload-low", _queued(100, 90, 128, 6)),
    _level("global-default", _queued(20, 50, 128, 6)),
)
_GET_CREATE_UPDATE = ("get", "create", "update")
SUGGESTED_SCHEMAS = (
    _schema(
        "system-nodes",
        "system",
        500,
        BY_USER,
        _everything(_groups("system:nodes")),
    ),
    _schema(
        "system-node-high",
        "node-high",
        400,
        BY_USER,
        PolicyRules(
            _groups("system:nodes"),
            (
                _resources(_ALL, ("",), ("nodes", "nodes/status"), True),
                _resources(_ALL, ("coordination.k8s.io",), ("leases",), False),
            ),
        ),
    ),
    _schema(
        "probes",
        EXEMPT,
        2,
        None,
        PolicyRules(
            _groups("system:unauthenticated", "system:authenticated"),
            (),
            (NonResourceRule(("get",), ("/healthz", "/readyz", "/livez")),),
        ),
    ),
    _schema(
        "system-leader-election",
        "leader-election",
        100,
        BY_USER,
        PolicyRules(
            _users("system:kube-controller-manager", "system:kube-scheduler") + _kube_system_accounts(NAME_ALL),
            (_resources(_GET_CREATE_UPDATE, ("coordination.k8s.io",), ("leases",), False),),
        ),
    ),
    _schema(
        "workload-leader-election",
        "leader-election",
        200,
        BY_USER,
        PolicyRules(
            _kube_system_accounts(NAME_ALL),
            (
                _resources(_GET_CREATE_UPDATE, ("",), ("endpoints", "configmaps"), False),
                _resources(_GET_CREATE_UPDATE, ("coordination.k8s.io",), ("leases",), False),
            ),
        ),
    ),
    _schema(
        "endpoint-controller",
        "workload-high",
        150,
        BY_USER,
        PolicyRules(
            _users("system:kube-controller-manager")
            + _kube_system_accounts("endpoint-controller", "endpointslicemirroring-controller"),
            (_resources(_GET_CREATE_UPDATE, ("",), ("endpoints",), False),),
        ),
    ),
    _schema(
        "kube-controller-manager",
        "workload-high",
        800,
        BY_NAMESPACE,
        _everything(_users("system:kube-controller-manager")),
    ),
    _schema("kube-scheduler", "workload-high", 800, BY_NAMESPACE, _everything(_users("system:kube-scheduler"))),
    _schema(
        "kube-system-service-accounts",
        "workload-high",
        900,
        BY_NAMESPACE,
        _everything(_kube_system_accounts(NAME_ALL)),
    ),
    _schema("service-accounts", "workload-low", 9000, BY_USER, _everything(_groups("system:serviceaccounts"))),
    _schema(
        "global-default",
        "global-default",
        9900,
        BY_USER,
        _everything(_groups("system:unauthenticated", "system:authenticated")),
    ),
)

MANDATORY: dict[str, Object] = {f"{type(o).__name__}/{o.name}": o for o in (*MANDATORY_LEVELS, *MANDATORY_SCHEMAS)}
MANDATORY_LEVEL_NAMES = {o.name: o for o in MANDATORY_LEVELS}
MANDATORY_SCHEMA_NAMES = {o.name: o for o in MANDATORY_SCHEMAS}


def with_uid(obj: Object, kind: str) -> Object:
    """`obj` with a UID: its own, or one derived from its kind and name (local mode's objects carry
    none; kube-apiserver would give them a random one at creation)."""
    if obj.meta.uid:
        return obj
    uid = str(uuid.uuid5(UID_NAMESPACE, f"{kind}/{obj.name}"))
    return replace(obj, meta=replace(obj.meta, uid=uid))


# --- the ensurer -------------------------------------------------------------------------------------


def _should_update_spec(obj: Object) -> bool:
    """`shouldUpdateSpec`: the annotation as Go's ParseBool reads it, else never updated (generation 1;
    a manifest from a folder has none, so is treated as just created)."""
    value = obj.meta.annotations.get(AUTO_UPDATE_ANNOTATION)
    parsed = _parse_bool(value) if value is not None else None
    if parsed is not None:
        return parsed
    return obj.meta.generation in (0, 1)


def _parse_bool(value: str) -> bool | None:
    """Go's `strconv.ParseBool`."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def _spec_equalish(bootstrap: Object, current: Object) -> bool:
    """`plcSpecEqualish` / `flowSchemaSpecEqual`: the exempt level's `spec.exempt` is the admin's."""
    if isinstance(bootstrap, PriorityLevel) and isinstance(current, PriorityLevel) and bootstrap.name == EXEMPT:
        if current.spec.exempt is None:
            return False
        return replace(bootstrap.spec, exempt=current.spec.exempt) == current.spec
    return bootstrap.spec == current.spec


def _revise(current: Object, bootstrap: Object, *, mandatory: bool) -> Object:
    """`strategy.ReviseIfNeeded`: the object kube-apiserver leaves in place (the spec and annotation
    it writes, when it writes)."""
    auto_update = mandatory or _should_update_spec(current)
    value = current.meta.annotations.get(AUTO_UPDATE_ANNOTATION)
    update_annotation = not (value is not None and _parse_bool(value) == auto_update)
    spec_changed = auto_update and not _spec_equalish(bootstrap, current)
    revised = current
    if spec_changed:
        revised = replace(revised, spec=bootstrap.spec)  # type: ignore[arg-type]
    if update_annotation:
        annotations = {**revised.meta.annotations, AUTO_UPDATE_ANNOTATION: "true" if auto_update else "false"}
        revised = replace(revised, meta=replace(revised.meta, annotations=annotations))
    return revised


def _ensure_kind(objects: Iterable[Object], mandatory: tuple[Object, ...], suggested: tuple[Object, ...]) -> list[Object]:
    current = {o.name: o for o in objects}
    for boot in suggested:
        current[boot.name] = _revise(current[boot.name], boot, mandatory=False) if boot.name in current else boot
    for boot in mandatory:
        current[boot.name] = _revise(current[boot.name], boot, mandatory=True) if boot.name in current else boot
    wanted = {o.name for o in (*mandatory, *suggested)}
    return [
        obj
        for name, obj in current.items()
        if name in wanted or _parse_bool(obj.meta.annotations.get(AUTO_UPDATE_ANNOTATION, "")) is not True
    ]


def ensure(
    levels: Iterable[PriorityLevel], schemas: Iterable[FlowSchema]
) -> tuple[list[PriorityLevel], list[FlowSchema]]:
    """The priority levels and FlowSchemas kube-apiserver holds once its ensurer has run on these."""
    ensured_levels = _ensure_kind(levels, MANDATORY_LEVELS, SUGGESTED_LEVELS)
    ensured_schemas = _ensure_kind(schemas, MANDATORY_SCHEMAS, SUGGESTED_SCHEMAS)
    return (
        [o for o in ensured_levels if isinstance(o, PriorityLevel)],
        [o for o in ensured_schemas if isinstance(o, FlowSchema)],
    )
