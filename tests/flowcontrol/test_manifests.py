"""FlowSchema and PriorityLevelConfiguration manifests are accepted and refused as kube-apiserver
accepts and refuses them on `kubectl apply`, with its messages (validation_test.go's cases, and the
messages its field errors print)."""

from __future__ import annotations

import copy

import pytest

from aggregator.flowcontrol import bootstrap
from aggregator.flowcontrol.manifests import Refused, decode_manifest, encode
from aggregator.flowcontrol.objects import FlowSchema, PriorityLevel
from tests.flowcontrol.support import Doc, flow_schema, priority_level

DNS_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
NS_LABEL = (
    "each member of this list must be '*' or a DNS-1123 label; a lowercase RFC 1123 label must consist of lower "
    "case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. "
    "'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def refusal(doc: Doc) -> str:
    with pytest.raises(Refused) as info:
        decode_manifest(doc)
    return str(info.value)


def test_a_valid_flow_schema_gets_v1_defaults() -> None:
    doc = flow_schema("tenants", "tenants", users=("alice",))
    del doc["spec"]["matchingPrecedence"]
    schema = decode_manifest(doc)
    assert isinstance(schema, FlowSchema)
    assert schema.spec.matching_precedence == 1000  # SetDefaults_FlowSchemaSpec
    assert schema.spec.distinguisher == "ByUser"


def test_a_priority_level_gets_v1_defaults() -> None:
    doc = priority_level("tenants", lendable=None)
    del doc["spec"]["limited"]["nominalConcurrencyShares"]
    doc["spec"]["limited"]["limitResponse"]["queuing"] = {}
    level = decode_manifest(doc)
    assert isinstance(level, PriorityLevel)
    limited = level.spec.limited
    assert limited is not None and limited.limit_response.queuing is not None
    assert (limited.nominal_concurrency_shares, limited.lendable_percent) == (30, 0)
    queuing = limited.limit_response.queuing
    assert (queuing.queues, queuing.hand_size, queuing.queue_length_limit) == (64, 8, 50)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["spec"].update(matchingPrecedence=10001),
            "spec.matchingPrecedence: Invalid value: 10001: must not be greater than 10000",
        ),
        (
            lambda d: d["spec"].update(matchingPrecedence=1),
            "spec.matchingPrecedence: Invalid value: 1: only the schema named 'exempt' may have matchingPrecedence 1",
        ),
        (
            lambda d: d["spec"].update(priorityLevelConfiguration={"name": "system+++$$"}),
            f'spec.priorityLevelConfiguration.name: Invalid value: "system+++$$": {DNS_SUBDOMAIN}',
        ),
        (
            lambda d: d["spec"].update(distinguisherMethod={"type": "ByFoo"}),
            'spec.distinguisherMethod.type: Unsupported value: flowcontrol.FlowDistinguisherMethod{Type:"ByFoo"}: '
            'supported values: "ByNamespace", "ByUser"',
        ),
        (
            lambda d: d["spec"]["rules"][0].update(subjects=[{"kind": "FooKind"}]),
            'spec.rules[0].subjects[0].kind: Unsupported value: "FooKind": supported values: "Group", '
            '"ServiceAccount", "User"',
        ),
        (
            lambda d: d["spec"]["rules"][0].update(
                subjects=[{"kind": "ServiceAccount", "user": {"name": "x"}, "group": {"name": "y"}}]
            ),
            "[spec.rules[0].subjects[0].serviceAccount: Required value: serviceAccount is required when subject "
            "kind is 'ServiceAccount', spec.rules[0].subjects[0].user: Forbidden: user is forbidden when subject "
            "kind is not 'User', spec.rules[0].subjects[0].group: Forbidden: group is forbidden when subject kind "
            "is not 'Group']",
        ),
        (
            lambda d: d["spec"]["rules"][0].update(
                subjects=[
                    {
                        "kind": "User",
                        "user": {"name": ""},
                        "serviceAccount": {"namespace": "a", "name": "b"},
                        "group": {"name": "y"},
                    }
                ]
            ),
            "[spec.rules[0].subjects[0].user.name: Required value, spec.rules[0].subjects[0].serviceAccount: "
            "Forbidden: serviceAccount is forbidden when subject kind is not 'ServiceAccount', "
            "spec.rules[0].subjects[0].group: Forbidden: group is forbidden when subject kind is not 'Group']",
        ),
        (
            lambda d: d["spec"]["rules"][0].update(
                subjects=[{"kind": "Group", "serviceAccount": {"namespace": "a", "name": "b"}, "user": {"name": "x"}}]
            ),
            "[spec.rules[0].subjects[0].group: Required value: group is required when subject kind is 'Group', "
            "spec.rules[0].subjects[0].serviceAccount: Forbidden: serviceAccount is forbidden when subject kind is "
            "not 'ServiceAccount', spec.rules[0].subjects[0].user: Forbidden: user is forbidden when subject kind "
            "is not 'User']",
        ),
        (
            lambda d: d["spec"]["rules"][0].update(
                subjects=[{"kind": "ServiceAccount", "serviceAccount": {"name": "noxu"}}]
            ),
            "spec.rules[0].subjects[0].serviceAccount.namespace: Required value: must specify namespace for "
            "service account",
        ),
        (
            lambda d: d["spec"]["rules"][0]["resourceRules"][0].update(verbs=["*", "create"]),
            'spec.rules[0].resourceRules[0].verbs: Invalid value: []string{"*", "create"}: if \'*\' is present, '
            "must not specify other verbs",
        ),
        (
            lambda d: d["spec"]["rules"][0]["resourceRules"][0].update(verbs=["feed"]),
            'spec.rules[0].resourceRules[0].verbs: Unsupported value: []string{"feed"}: supported values: '
            '"create", "delete", "deletecollection", "get", "list", "patch", "proxy", "update", "watch"',
        ),
        (
            lambda d: d["spec"]["rules"][0]["resourceRules"][0].update(namespaces=["-foo"], clusterScope=False),
            f'spec.rules[0].resourceRules[0].namespaces[0]: Invalid value: "-foo": {NS_LABEL}',
        ),
        (
            lambda d: d["spec"]["rules"][0]["resourceRules"][0].update(namespaces=[], clusterScope=False),
            "spec.rules[0].resourceRules[0].namespaces: Required value: resource rules that are not cluster scoped "
            "must supply at least one namespace",
        ),
        (
            lambda d: d["spec"]["rules"][0]["nonResourceRules"][0].update(nonResourceURLs=["*", "tik"]),
            'spec.rules[0].nonResourceRules[0].nonResourceURLs: Invalid value: []string{"*", "tik"}: if \'*\' is '
            "present, must not specify other non-resource URLs",
        ),
        (
            lambda d: d["spec"]["rules"][0]["nonResourceRules"][0].update(nonResourceURLs=["/apis/*/x"]),
            'spec.rules[0].nonResourceRules[0].nonResourceURLs[0]: Invalid value: "/apis/*/x": wildcard can only '
            "do suffix matching",
        ),
        (
            lambda d: d["spec"]["rules"][0].pop("resourceRules") and d["spec"]["rules"][0].pop("nonResourceRules"),
            "spec.rules[0]: Required value: at least one of resourceRules and nonResourceRules has to be non-empty",
        ),
    ],
)
def test_an_invalid_flow_schema_is_refused_with_kube_apiservers_message(mutate: object, message: str) -> None:
    doc = flow_schema("tenants", "tenants", users=("alice",))
    mutate(doc)  # type: ignore[operator]
    assert refusal(doc) == f'FlowSchema.flowcontrol.apiserver.k8s.io "tenants" is invalid: {message}'


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["spec"]["limited"]["limitResponse"]["queuing"].update(queueLengthLimit=-1),
            "spec.limited.limitResponse.queuing.queueLengthLimit: Invalid value: -1: must be positive",
        ),
        (
            lambda d: d["spec"]["limited"]["limitResponse"]["queuing"].update(handSize=65, queues=64),
            "spec.limited.limitResponse.queuing.handSize: Invalid value: 65: should not be greater than queues (64)",
        ),
        (
            lambda d: d["spec"]["limited"]["limitResponse"]["queuing"].update(handSize=30, queues=512),
            "spec.limited.limitResponse.queuing.handSize: Invalid value: 30: required entropy bits of deckSize 512 "
            "and handSize 30 should not be greater than 60",
        ),
        (
            lambda d: d["spec"]["limited"].update(lendablePercent=101),
            "spec.limited.lendablePercent: Invalid value: 101: must be between 0 and 100, inclusive",
        ),
        (
            lambda d: d["spec"]["limited"].update(borrowingLimitPercent=-1),
            "spec.limited.borrowingLimitPercent: Invalid value: -1: if specified, must be a non-negative integer",
        ),
        (
            lambda d: d["spec"]["limited"].update(nominalConcurrencyShares=-1),
            "spec.limited.nominalConcurrencyShares: Invalid value: -1: must be a non-negative integer",
        ),
        (
            lambda d: d["spec"]["limited"]["limitResponse"].update(type="Reject"),
            "spec.limited.limitResponse.queuing: Forbidden: must be nil if limited.limitResponse.type is not Limited",
        ),
        (
            lambda d: d["spec"].update(type="Exempt"),
            "[spec.type: Invalid value: \"Exempt\": type must be 'Exempt' if and only if name is 'exempt', "
            "spec.limited: Forbidden: must be nil if the type is not Limited]",
        ),
    ],
)
def test_an_invalid_priority_level_is_refused_with_kube_apiservers_message(mutate: object, message: str) -> None:
    doc = priority_level("tenants")
    mutate(doc)  # type: ignore[operator]
    assert refusal(doc) == f'PriorityLevelConfiguration.flowcontrol.apiserver.k8s.io "tenants" is invalid: {message}'


def test_a_mandatory_object_must_keep_its_fixed_spec_but_exempts_own_field_is_the_admins() -> None:
    catch_all = encode(bootstrap.CATCH_ALL_LEVEL)
    catch_all["spec"]["limited"]["nominalConcurrencyShares"] = 50
    assert refusal(catch_all).endswith("spec of 'catch-all' must equal the fixed value")
    exempt = encode(bootstrap.EXEMPT_LEVEL)
    exempt["spec"]["exempt"] = {"nominalConcurrencyShares": 10, "lendablePercent": 50}
    level = decode_manifest(exempt)
    assert isinstance(level, PriorityLevel) and level.shares() == (10, 50, None)
    schema = encode(bootstrap.EXEMPT_SCHEMA)
    schema["spec"]["matchingPrecedence"] = 2
    assert refusal(schema).endswith("spec of 'exempt' must equal the fixed value")


def test_unknown_fields_and_wrong_types_are_refused_as_strict_decoding_refuses_them() -> None:
    doc = flow_schema("tenants", "tenants", users=("alice",))
    doc["spec"]["matchingPrecedense"] = 5
    assert refusal(doc) == (
        'FlowSchema in version "v1" cannot be handled as a FlowSchema: strict decoding error: '
        'unknown field "spec.matchingPrecedense"'
    )
    level = priority_level("tenants")
    level["spec"]["limited"]["nominalConcurrencyShares"] = "ten"
    assert refusal(level).startswith(
        'PriorityLevelConfiguration.flowcontrol.apiserver.k8s.io "tenants" could not be decoded: '
        "spec.limited.nominalConcurrencyShares: expected integer"
    )


def test_every_bootstrap_object_round_trips_and_is_valid() -> None:
    for obj in (*bootstrap.MANDATORY_LEVELS, *bootstrap.SUGGESTED_LEVELS, *bootstrap.MANDATORY_SCHEMAS, *bootstrap.SUGGESTED_SCHEMAS):
        assert decode_manifest(copy.deepcopy(encode(obj))) == obj
