"""Event JSON lines: byte for byte what kube-apiserver writes, compared with events it really wrote."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregator.audit.body import BodyCapture
from aggregator.audit.event import (
    Event,
    ObjectRef,
    ResponseStatus,
    encode_event,
    event_document,
    micro_time,
    source_ips,
    truncate_user_agent,
)
from aggregator.audit.policy import Level, Stage
from aggregator.model.userinfo import UserInfo
from tests.audit.support import T0, Clock, auditor, info_of, mocked_request, policy_for

# Two events kube-apiserver wrote for one watch of an aggregated API (build.openshift.io is served
# by openshift-apiserver behind kube-aggregator), kept as test data by
# openshift/cluster-logging-operator (test/functional/outputs, `OpenshiftAuditLogs`).
RBAC = (
    'RBAC: allowed by ClusterRoleBinding "system:kube-controller-manager" of ClusterRole '
    '"system:kube-controller-manager" to User "system:kube-controller-manager"'
)
UPSTREAM_WATCH_STARTED = (
    '{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"dcd6f8b9-346f-4c09-8273-'
    'e45ec3e5129d","stage":"ResponseStarted","requestURI":"/apis/build.openshift.io/v1/builds?allowWatchBookmarks'
    '=true\\u0026resourceVersion=1111225\\u0026timeout=7m35s\\u0026timeoutSeconds=455\\u0026watch=true","verb":'
    '"watch","user":{"username":"system:kube-controller-manager","groups":["system:authenticated"]},"sourceIPs":'
    '["192.168.130.11","10.217.0.1"],"userAgent":"cluster-policy-controller/v0.0.0 (linux/amd64) kubernetes/'
    '$Format","objectRef":{"resource":"builds","apiGroup":"build.openshift.io","apiVersion":"v1"},'
    '"responseStatus":{"metadata":{},"status":"Success","message":"Connection closed early","code":200},'
    '"requestReceivedTimestamp":"2021-03-17T10:31:05.145955Z","stageTimestamp":"2021-03-17T10:38:40.164196Z",'
    '"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed by '
    'ClusterRoleBinding \\"system:kube-controller-manager\\" of ClusterRole \\"system:kube-controller-manager\\" '
    'to User \\"system:kube-controller-manager\\""}}'
)
UPSTREAM_WATCH_COMPLETE = UPSTREAM_WATCH_STARTED.replace(
    '"stage":"ResponseStarted"', '"stage":"ResponseComplete"'
).replace("10:38:40.164196Z", "10:38:40.164288Z")


def ts(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def test_watch_events_match_kube_apiserver_byte_for_byte() -> None:
    clock = Clock(
        [
            ts("2021-03-17T10:31:05.145955Z"),
            ts("2021-03-17T10:38:40.164196Z"),
            ts("2021-03-17T10:38:40.164288Z"),
        ]
    )
    audit, writer = auditor(policy_for("Metadata", omitStages=["RequestReceived"]), clock=clock)
    request = mocked_request(
        "GET",
        "/apis/build.openshift.io/v1/builds?allowWatchBookmarks=true&resourceVersion=1111225&timeout=7m35s"
        "&timeoutSeconds=455&watch=true",
        {
            "Audit-ID": "dcd6f8b9-346f-4c09-8273-e45ec3e5129d",
            "User-Agent": "cluster-policy-controller/v0.0.0 (linux/amd64) kubernetes/$Format",
            "X-Forwarded-For": "192.168.130.11",
        },
        peer="10.217.0.1",
    )
    user = UserInfo("system:kube-controller-manager", groups=("system:authenticated",))
    recorded = audit.begin(request, user, info_of(request))
    assert recorded is not None
    recorded.authorized(True, RBAC)
    recorded.complete()  # the watch ended before anything was written: "Connection closed early"
    lines = [encode_event(event) for event in writer.events]
    assert lines == [UPSTREAM_WATCH_STARTED.encode() + b"\n", UPSTREAM_WATCH_COMPLETE.encode() + b"\n"]


# A create that failed with 409, from the same test data (`K8sAuditLogs`).
UPSTREAM_CONFLICT = (
    '{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"45ad7c9f-486d-46c7-b29f-'
    '8fdf46784ea9","stage":"ResponseComplete","requestURI":"/apis/monitoring.coreos.com/v1/namespaces/openshift-'
    'logging/prometheusrules","verb":"create","user":{"username":"system:serviceaccount:openshift-operators-'
    'redhat:elasticsearch-operator","uid":"ba1589ec-be2b-4d61-9946-c1e3b6f635d2","groups":["system:'
    'serviceaccounts","system:serviceaccounts:openshift-operators-redhat","system:authenticated"]},"sourceIPs":'
    '["63.29.116.39"],"userAgent":"elasticsearch-operator/v0.0.0 (linux/amd64) kubernetes/$Format","objectRef":'
    '{"resource":"prometheusrules","namespace":"openshift-logging","name":"elasticsearch-prometheus-rules",'
    '"apiGroup":"monitoring.coreos.com","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure",'
    '"reason":"AlreadyExists","code":409},"requestReceivedTimestamp":"2021-03-12T15:11:04.610686Z",'
    '"stageTimestamp":"2021-03-12T15:11:04.625042Z","annotations":{"authentication.k8s.io/legacy-token":'
    '"system:serviceaccount:openshift-operators-redhat:elasticsearch-operator","authorization.k8s.io/decision":'
    '"allow","authorization.k8s.io/reason":"RBAC: allowed by ClusterRoleBinding \\"elasticsearch-operator.4.6.0-'
    '202102130420.p0-6c59c9c74d\\" of ClusterRole \\"elasticsearch-operator.4.6.0-202102130420.p0-6c59c9c74d\\" '
    'to ServiceAccount \\"elasticsearch-operator/openshift-operators-redhat\\""}}'
)


def test_status_user_uid_and_annotation_order_match_kube_apiserver() -> None:
    expected = json.loads(UPSTREAM_CONFLICT)
    user = expected["user"]
    ref = expected["objectRef"]
    event = Event(
        level=Level.METADATA,
        audit_id=expected["auditID"],
        stage=Stage.RESPONSE_COMPLETE,
        request_uri=expected["requestURI"],
        verb="create",
        user=UserInfo(user["username"], user["uid"], tuple(user["groups"])),
        request_received=ts(expected["requestReceivedTimestamp"]),
        stage_timestamp=ts(expected["stageTimestamp"]),
        source_ips=("63.29.116.39",),
        user_agent=expected["userAgent"],
        object_ref=ObjectRef(
            resource=ref["resource"],
            namespace=ref["namespace"],
            name=ref["name"],
            api_group=ref["apiGroup"],
            api_version=ref["apiVersion"],
        ),
        response_status=ResponseStatus(code=409, status="Failure", reason="AlreadyExists"),
        # given in reverse: Go writes map keys sorted
        annotations=dict(reversed(list(expected["annotations"].items()))),
    )
    assert encode_event(event) == UPSTREAM_CONFLICT.encode() + b"\n"


def minimal(**changes: Any) -> Event:
    fields: dict[str, Any] = {
        "level": Level.REQUEST_RESPONSE,
        "audit_id": "id",
        "stage": Stage.RESPONSE_COMPLETE,
        "request_uri": "/apis/g/v1/things",
        "verb": "create",
        "user": None,
        "request_received": T0,
        "stage_timestamp": T0,
    }
    fields.update(changes)
    return Event(**fields)


def test_always_present_fields_and_omitempty() -> None:
    doc = event_document(minimal())
    assert list(doc) == [
        "kind",
        "apiVersion",
        "level",
        "auditID",
        "stage",
        "requestURI",
        "verb",
        "user",
        "requestReceivedTimestamp",
        "stageTimestamp",
    ]
    assert doc["user"] == {}  # a failed authentication has no user, still written as {}


def test_full_field_order() -> None:
    body = BodyCapture()
    body.feed(b'{"kind":"Thing"}')
    body.finish()
    event = minimal(
        user=UserInfo("alice", "u1", ("g",), {"b": ("2",), "a": ("1",)}),
        impersonated_user=UserInfo("bob"),
        source_ips=("10.0.0.1",),
        user_agent="ua",
        object_ref=ObjectRef(resource="things", api_group="g", api_version="v1"),
        response_status=ResponseStatus(code=201),
        request_body=body.snapshot(),
        response_body=body.snapshot(),
        annotations={"k": "v"},
    )
    doc = event_document(event)
    assert list(doc) == [
        "kind",
        "apiVersion",
        "level",
        "auditID",
        "stage",
        "requestURI",
        "verb",
        "user",
        "impersonatedUser",
        "sourceIPs",
        "userAgent",
        "objectRef",
        "responseStatus",
        "requestObject",
        "responseObject",
        "requestReceivedTimestamp",
        "stageTimestamp",
        "annotations",
    ]
    assert doc["user"] == {
        "username": "alice",
        "uid": "u1",
        "groups": ["g"],
        "extra": {"a": ["1"], "b": ["2"]},
    }
    assert list(doc["user"]["extra"]) == ["a", "b"]
    assert doc["impersonatedUser"] == {"username": "bob"}
    assert doc["responseStatus"] == {"metadata": {}, "code": 201}


def test_micro_time_has_six_digits_and_z() -> None:
    assert micro_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"
    assert micro_time(T0) == "2026-03-01T12:00:00.123456Z"


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ("kubectl/v1.33", "kubectl/v1.33"),
        ("a" * 1024, "a" * 1024),
        ("a" * 1025, "a" * 1024 + "...TRUNCATED"),
        # cut inside a 3-byte character: Go's encoder writes U+FFFD per leftover byte
        ("a" * 1023 + "€", "a" * 1023 + "\ufffd...TRUNCATED"),
        ("a" * 1022 + "€", "a" * 1022 + "\ufffd\ufffd...TRUNCATED"),
        ("bad\udcffbyte", "bad\ufffdbyte"),  # aiohttp's surrogateescape for a non-UTF-8 byte
    ],
)
def test_user_agent_is_cut_at_1024_bytes(agent: str, expected: str) -> None:
    assert truncate_user_agent(agent) == expected


@pytest.mark.parametrize(
    ("forwarded", "real", "remote", "expected"),
    [
        (None, None, "10.0.0.1", ("10.0.0.1",)),
        ("1.1.1.1, bogus, 2.2.2.2", None, "10.0.0.1", ("1.1.1.1", "2.2.2.2", "10.0.0.1")),
        ("1.1.1.1", "1.1.1.1", "10.0.0.1", ("1.1.1.1", "10.0.0.1")),  # X-Real-Ip already listed
        ("1.1.1.1", "3.3.3.3", "1.1.1.1", ("1.1.1.1", "3.3.3.3", "1.1.1.1")),
        ("1.1.1.1", None, "1.1.1.1", ("1.1.1.1",)),  # the peer is already last
        (None, None, "::ffff:10.0.0.1", ("10.0.0.1",)),  # Go prints an IPv4-mapped address as IPv4
        ("fe80::1%eth0", None, "2001:db8::1", ("2001:db8::1",)),  # net.ParseIP takes no zone
        (None, None, None, ()),
    ],
)
def test_source_ips_follow_utilnet(
    forwarded: str | None, real: str | None, remote: str | None, expected: tuple[str, ...]
) -> None:
    assert source_ips(forwarded, real, remote) == expected


def test_request_object_fills_object_ref_like_log_request_object() -> None:
    body = BodyCapture()
    body.feed(b'{"metadata":{"name":"f1","namespace":"ns","uid":"u","resourceVersion":"7"}}')
    body.finish()
    event = minimal(
        object_ref=ObjectRef(resource="flunders", namespace="ns", api_group="wardle", api_version="v1"),
        request_body=body.snapshot(),
    )
    assert event_document(event)["objectRef"] == {
        "resource": "flunders",
        "namespace": "ns",
        "name": "f1",
        "uid": "u",
        "apiGroup": "wardle",
        "apiVersion": "v1",
        "resourceVersion": "7",
    }


def test_unpaired_surrogate_escape_in_a_body_becomes_replacement_character() -> None:
    body = BodyCapture()
    body.feed(b'{"name":"a\\ud800b"}')
    body.finish()
    line = encode_event(minimal(response_body=body.snapshot()))
    assert json.loads(line)["responseObject"] == {"name": "a\ufffdb"}


def test_go_html_escaping_and_trailing_newline() -> None:
    line = encode_event(minimal(request_uri="/x?a=<b>&c"))
    assert b'"requestURI":"/x?a=\\u003cb\\u003e\\u0026c"' in line
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
