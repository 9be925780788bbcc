"""APIService decoding and validation: every rule of upstream's ValidateAPIService, exact messages."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from aggregator.model.apiservice import (
    Condition,
    available_column,
    decode_apiservice,
    name_to_group_version,
    service_column,
    set_condition,
    validate_apiservice,
    validate_status,
)
from aggregator.model.decode import DecodeError

DNS1123 = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035 = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def apiservice(name: str = "v1alpha1.wardle.example.com", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "group": "wardle.example.com",
        "version": "v1alpha1",
        "service": {"namespace": "wardle", "name": "api"},
        "groupPriorityMinimum": 1000,
        "versionPriority": 15,
    }
    base.update(spec)
    base = {k: v for k, v in base.items() if v is not None}
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name},
        "spec": base,
    }


def errors(obj: dict[str, Any]) -> list[str]:
    return validate_apiservice(decode_apiservice(obj))


def test_valid_remote_and_defaulted_port() -> None:
    svc = decode_apiservice(apiservice())
    assert validate_apiservice(svc) == []
    assert svc.service is not None and svc.service.port == 443
    assert svc.service.server_name == "api.wardle.svc"
    assert not svc.local


def test_valid_local() -> None:
    assert errors(apiservice(service=None)) == []
    assert decode_apiservice(apiservice(service=None)).local


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (apiservice(name=""), ["metadata.name: Required value: name or generateName is required"]),
        (
            apiservice(name="v1.other.example.com"),
            [
                'metadata.name: Invalid value: "v1.other.example.com": must be `spec.version+"."+spec.group`: "v1alpha1.wardle.example.com"'
            ],
        ),
        (apiservice(name="."), ["metadata.name: Invalid value: \".\": may not be '.'"]),
        (apiservice(name=".."), ["metadata.name: Invalid value: \"..\": may not be '..'"]),
        (
            apiservice(name="v1/x%y"),
            [
                "metadata.name: Invalid value: \"v1/x%y\": may not contain '/'",
                "metadata.name: Invalid value: \"v1/x%y\": may not contain '%'",
            ],
        ),
        (
            apiservice(name="v2.", group="", version="v2"),
            ["spec.group: Required value: only v1 may have an empty group and it better be legacy kube"],
        ),
        (
            apiservice(name="v1alpha1.Wardle", group="Wardle"),
            [f'spec.group: Invalid value: "Wardle": {DNS1123}'],
        ),
        (
            apiservice(name="v1alpha1." + "a" * 254, group="a" * 254),
            [f'spec.group: Invalid value: "{"a" * 254}": must be no more than 253 characters'],
        ),
        (
            apiservice(name="V1.wardle.example.com", version="V1"),
            [f'spec.version: Invalid value: "V1": {DNS1035}'],
        ),
        (
            apiservice(groupPriorityMinimum=0),
            ["spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000"],
        ),
        (
            apiservice(groupPriorityMinimum=20001),
            ["spec.groupPriorityMinimum: Invalid value: 20001: must be positive and less than 20000"],
        ),
        (
            apiservice(versionPriority=-1),
            ["spec.versionPriority: Invalid value: -1: must be positive and less than 1000"],
        ),
        (
            apiservice(versionPriority=1001),
            ["spec.versionPriority: Invalid value: 1001: must be positive and less than 1000"],
        ),
        (
            apiservice(service=None, caBundle=base64.b64encode(b"12345").decode()),
            ['spec.caBundle: Invalid value: "5 bytes": local APIServices may not have a caBundle'],
        ),
        (
            apiservice(service=None, insecureSkipTLSVerify=True),
            [
                "spec.insecureSkipTLSVerify: Invalid value: true: local APIServices may not have insecureSkipTLSVerify"
            ],
        ),
        (apiservice(service={"name": "api"}), ["spec.service.namespace: Required value"]),
        (apiservice(service={"namespace": "wardle"}), ["spec.service.name: Required value"]),
        (
            apiservice(service={"namespace": "wardle", "name": "api", "port": 0}),
            [
                "spec.service.port: Invalid value: 0: port is not valid: must be between 1 and 65535, inclusive"
            ],
        ),
        (
            apiservice(service={"namespace": "wardle", "name": "api", "port": 65536}),
            [
                "spec.service.port: Invalid value: 65536: port is not valid: must be between 1 and 65535, inclusive"
            ],
        ),
        (
            apiservice(insecureSkipTLSVerify=True, caBundle=base64.b64encode(b"x").decode()),
            ["spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present"],
        ),
    ],
)
def test_each_rule(obj: dict[str, Any], expected: list[str]) -> None:
    assert errors(obj) == expected


def test_boundaries_are_valid() -> None:
    assert errors(apiservice(groupPriorityMinimum=20000, versionPriority=1000)) == []
    assert errors(apiservice(groupPriorityMinimum=1, versionPriority=1)) == []
    assert errors(apiservice(name="v1.", group="", version="v1")) == []


def test_all_errors_in_upstream_order() -> None:
    obj = apiservice(
        name="wrong",
        groupPriorityMinimum=0,
        versionPriority=0,
        service={"port": 0},
        insecureSkipTLSVerify=True,
        caBundle="eA==",
    )
    assert [e.split(":")[0] for e in errors(obj)] == [
        "metadata.name",
        "spec.groupPriorityMinimum",
        "spec.versionPriority",
        "spec.service.namespace",
        "spec.service.name",
        "spec.service.port",
        "spec.insecureSkipTLSVerify",
    ]


def test_namespace_is_forbidden_on_a_cluster_scoped_object() -> None:
    obj = apiservice()
    obj["metadata"]["namespace"] = "default"
    assert errors(obj) == ["metadata.namespace: Forbidden: not allowed on this type"]


def test_version_name_with_a_dot_never_validates() -> None:
    # versions are DNS-1035 labels, so the first '.' of a name always separates version from group
    assert errors(apiservice(name="v1.0.wardle.example.com", version="v1.0"))[0].startswith("spec.version")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"groupPriorityMinimum": "1000"}, "spec.groupPriorityMinimum: expected integer"),
        ({"service": {"namespace": "a", "name": "b", "port": "443"}}, "spec.service.port: expected integer"),
        ({"insecureSkipTLSVerify": "false"}, "spec.insecureSkipTLSVerify: expected boolean"),
        ({"caBundle": "not base64!"}, "spec.caBundle: illegal base64 data"),
        ({"versionPriority": 2**31}, "spec.versionPriority: 2147483648 overflows int32"),
    ],
)
def test_wrong_types_are_decode_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(")):
        decode_apiservice(apiservice(**spec))


def test_cabundle_is_bytes_in_memory() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    assert decode_apiservice(apiservice(caBundle=base64.b64encode(pem).decode())).ca_bundle == pem


def test_status_validation() -> None:
    obj = apiservice()
    obj["status"] = {"conditions": [{"type": "Available", "status": "Maybe"}]}
    assert validate_status(decode_apiservice(obj)) == [
        'status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown"'
    ]


def test_name_to_group_version() -> None:
    assert name_to_group_version("v1beta1.metrics.k8s.io") == ("metrics.k8s.io", "v1beta1")
    assert name_to_group_version("v1.") == ("", "v1")


def test_set_condition_moves_transition_time_only_on_status_flip() -> None:
    first = set_condition((), Condition("Available", "False", "t1", "ServiceNotFound", "gone"))
    same = set_condition(first, Condition("Available", "False", "t2", "MissingEndpoints", "none"))
    assert same == (Condition("Available", "False", "t1", "MissingEndpoints", "none"),)
    flipped = set_condition(same, Condition("Available", "True", "t3", "Passed", "all checks passed"))
    assert flipped == (Condition("Available", "True", "t3", "Passed", "all checks passed"),)


def test_table_columns() -> None:
    svc = decode_apiservice(apiservice())
    assert service_column(svc) == "wardle/api"
    assert available_column(svc) == "Unknown"
    down = svc.with_conditions((Condition("Available", "False", None, "MissingEndpoints"),))
    assert available_column(down) == "False (MissingEndpoints)"
    assert available_column(svc.with_conditions((Condition("Available", "True"),))) == "True"
    assert service_column(decode_apiservice(apiservice(service=None))) == "Local"
