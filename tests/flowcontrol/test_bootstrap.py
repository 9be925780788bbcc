"""kube-apiserver's bootstrap configuration, and what its ensurer leaves of a set of objects
(`pkg/registry/flowcontrol/ensurer`): what local mode applies for the folder's objects."""

from __future__ import annotations

from dataclasses import replace

from aggregator.flowcontrol import bootstrap
from aggregator.flowcontrol.bootstrap import ensure
from aggregator.flowcontrol.manifests import decode_manifest
from aggregator.flowcontrol.objects import AUTO_UPDATE_ANNOTATION, Exempt, FlowSchema, PriorityLevel
from tests.flowcontrol.support import flow_schema, priority_level


def names(objs: list[PriorityLevel] | list[FlowSchema]) -> list[str]:
    return sorted(o.name for o in objs)


def level(doc: dict[str, object]) -> PriorityLevel:
    obj = decode_manifest(doc)
    assert isinstance(obj, PriorityLevel)
    return obj


def test_nothing_gives_the_configuration_of_a_new_cluster() -> None:
    levels, schemas = ensure((), ())
    assert names(levels) == [
        "catch-all", "exempt", "global-default", "leader-election", "node-high", "system", "workload-high", "workload-low",
    ]
    assert names(schemas) == [
        "catch-all", "endpoint-controller", "exempt", "global-default", "kube-controller-manager", "kube-scheduler",
        "kube-system-service-accounts", "probes", "service-accounts", "system-leader-election", "system-node-high",
        "system-nodes", "workload-leader-election",
    ]
    assert all(o.meta.annotations == {AUTO_UPDATE_ANNOTATION: "true"} for o in levels)
    assert all(o.meta.annotations == {AUTO_UPDATE_ANNOTATION: "true"} for o in schemas)


def test_a_users_own_objects_are_kept_beside_the_bootstrap_ones() -> None:
    levels, schemas = ensure([level(priority_level("tenants"))], [])
    assert "tenants" in names(levels) and len(levels) == 9 and len(schemas) == 13


def test_a_suggested_object_written_without_the_annotation_is_overwritten_as_upstream_does() -> None:
    """A new object (generation 1, or a manifest with none) and no annotation: the ensurer takes it."""
    mine = level(priority_level("global-default", shares=500))
    levels, _ = ensure([mine], [])
    kept = next(o for o in levels if o.name == "global-default")
    assert kept.spec == next(o for o in bootstrap.SUGGESTED_LEVELS if o.name == "global-default").spec
    assert kept.meta.annotations[AUTO_UPDATE_ANNOTATION] == "true"


def test_a_suggested_object_that_says_autoupdate_false_keeps_its_spec() -> None:
    doc = priority_level("global-default", shares=500)
    doc["metadata"]["annotations"] = {AUTO_UPDATE_ANNOTATION: "false"}
    levels, _ = ensure([level(doc)], [])
    kept = next(o for o in levels if o.name == "global-default")
    assert kept.shares()[0] == 500


def test_a_mandatory_object_always_gets_its_fixed_spec_but_exempt_keeps_its_shares() -> None:
    exempt = replace(bootstrap.EXEMPT_LEVEL, spec=replace(bootstrap.EXEMPT_LEVEL.spec, exempt=Exempt(7, 0)))
    catch_all = replace(bootstrap.CATCH_ALL_LEVEL, spec=bootstrap.SUGGESTED_LEVELS[0].spec)
    levels, _ = ensure([exempt, catch_all], [])
    assert next(o for o in levels if o.name == "exempt").shares()[0] == 7
    assert next(o for o in levels if o.name == "catch-all").spec == bootstrap.CATCH_ALL_LEVEL.spec


def test_a_former_bootstrap_object_that_asks_for_auto_update_is_removed() -> None:
    """`RemoveUnwantedObjects`: such an object is the ensurer's own, and no longer wanted."""
    doc = flow_schema("retired", "global-default", users=("x",))
    doc["metadata"]["annotations"] = {AUTO_UPDATE_ANNOTATION: "true"}
    obj = decode_manifest(doc)
    assert isinstance(obj, FlowSchema)
    _, schemas = ensure([], [obj])
    assert "retired" not in names(schemas)
