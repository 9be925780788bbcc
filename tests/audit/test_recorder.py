"""The recorder driven the way the request pipeline drives it, through a tiny aiohttp app that streams
bodies like the proxy, with events read back from a real audit log file: one test per level."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from aggregator.audit.event import ResponseStatus, encode_event
from aggregator.audit.policy import parse_policy
from aggregator.audit.recorder import AUDIT_ID_RESPONSE_HEADER, AuditMetrics, Auditor, AuditRequest, audit_id
from aggregator.audit.sinks import RotatingFile
from aggregator.audit.writer import BufferedWriter
from aggregator.model.status import status_body
from aggregator.model.userinfo import UserInfo
from aggregator.web.context import RequestContext
from tests.audit.support import ListWriter, info_of, mocked_request, policy_for
from tests.audit.support import auditor as make_auditor
from tests.support.contexts import context_for

AUDIT = web.AppKey("audit", Auditor)
RECORD = web.RequestKey("record", AuditRequest)
CONTEXT = web.RequestKey("context", RequestContext)
FLUNDERS = "/apis/wardle.example.com/v1alpha1/namespaces/ns/flunders"
WATCH_EVENTS = [b'{"type":"ADDED","object":{"kind":"Flunder"}}\n'] * 3


def created(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": "u-1", "resourceVersion": "5"}}


async def backend(request: web.Request) -> web.StreamResponse:
    """Streams like the proxy: request chunks are fed to the tee as they pass, response chunks too."""
    record = request.get(RECORD)
    tee = record.request_capture() if record else None
    body = bytearray()
    async for chunk in request.content.iter_chunked(5):
        if tee:
            tee.feed(chunk)
        body += chunk
    if tee:
        tee.finish()
    ctx = request.get(CONTEXT)
    assert ctx is not None and ctx.info is not None
    info = ctx.info
    if info.resource == "explode":
        raise RuntimeError("kaboom")
    if info.verb == "watch":
        answer, code = b"".join(WATCH_EVENTS), 200
    elif request.method == "POST":
        answer, code = json.dumps(created(json.loads(body))).encode(), 201
    else:
        answer, code = b'{"kind":"FlunderList","metadata":{},"items":[]}', 200
    response = web.StreamResponse(status=code, headers={"Content-Type": "application/json"})
    out = record.response_capture("application/json") if record else None
    if record:
        record.response_started(code)
    await response.prepare(request)
    for start in range(0, len(answer), 7):
        chunk = answer[start : start + 7]
        if out:
            out.feed(chunk)
        await response.write(chunk)
    if out:
        out.finish()
    await response.write_eof()
    return response


@web.middleware
async def pipeline(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """What the gateway's pipeline does around its handlers: authenticate, begin, impersonate,
    authorize, handle, then complete (or panic)."""
    auditor = request.app[AUDIT]
    ctx = request[CONTEXT] = context_for(
        request.method, request.raw_path, headers=request.headers, remote=request.remote
    )
    assert ctx.info is not None
    info = ctx.info
    name = request.headers.get("X-Test-User")
    if not name:
        auditor.failed_authentication(ctx, info, status=status_body(401, "Unauthorized"))
        return _status(401, "Unauthorized")
    record = auditor.begin(ctx, UserInfo(name, groups=("system:authenticated",)), info)
    if record:
        request[RECORD] = record
        if target := request.headers.get("Impersonate-User"):
            record.impersonated(UserInfo(target, groups=("system:authenticated",)))
    if info.namespace == "forbidden":
        message = f'flunders.wardle.example.com is forbidden: User "{name}" cannot list resource "flunders"'
        if record:
            record.authorized(False, "")
            record.complete(403, status_body(403, message))
        return _status(403, message)
    if record:
        record.authorized(True, "RBAC: allowed")
    try:
        response = await handler(request)
    except Exception as err:
        if record:
            record.panic(str(err))
        raise
    if record:
        record.complete(response.status)
    return response


def _status(code: int, message: str) -> web.Response:
    return web.json_response(status_body(code, message), status=code)


async def _echo_audit_id(request: web.Request, response: web.StreamResponse) -> None:
    """What the pipeline's head listener does (`audit/filter.py`): every answer carries Audit-Id."""
    ctx = request.get(CONTEXT)
    if ctx is not None and AUDIT_ID_RESPONSE_HEADER not in response.headers:
        response.headers[AUDIT_ID_RESPONSE_HEADER] = audit_id(ctx)


Events = Callable[[], list[dict[str, Any]]]
Start = Callable[..., Awaitable[tuple[TestClient[web.Request, web.Application], Events]]]


@pytest.fixture
async def audited(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[Start]:
    """`await audited(policy)` -> (client, events): an app audited into tmp_path/audit.log."""
    auditors: list[Auditor] = []
    log = tmp_path / "audit.log"

    async def start(policy: str, *, body_limit: int = 64 * 1024) -> tuple[Any, Events]:
        metrics = AuditMetrics(CollectorRegistry())
        writer = BufferedWriter(RotatingFile(str(log), max_bytes=1 << 20), metrics.errors)
        auditor = Auditor(parse_policy(policy), writer, metrics, body_limit=body_limit)
        auditor.start()
        auditors.append(auditor)
        app = web.Application(middlewares=[pipeline])
        app[AUDIT] = auditor
        app.on_response_prepare.append(_echo_audit_id)
        app.router.add_route("*", "/{tail:.*}", backend)

        def events() -> list[dict[str, Any]]:
            assert auditor.wait_idle(10)
            text = log.read_text() if log.exists() else ""
            return [json.loads(line) for line in text.splitlines()]

        return await aiohttp_client(app), events

    yield start
    for auditor in auditors:
        assert auditor.stop(timeout=10)


ALICE = {"X-Test-User": "alice", "User-Agent": "kubectl/v1.33.0 (linux/amd64)"}
FLUNDER = {"apiVersion": "wardle.example.com/v1alpha1", "kind": "Flunder", "metadata": {"name": "f1"}}


def stages(events: list[dict[str, Any]]) -> list[str]:
    return [e["stage"] for e in events]


async def test_level_none_writes_nothing_but_echoes_the_audit_id(audited: Start) -> None:
    client, events = await audited(policy_for("None"))
    resp = await client.get(FLUNDERS, headers={**ALICE, "Audit-ID": "caller-chosen-id"})
    assert resp.status == 200
    assert resp.headers["Audit-Id"] == "caller-chosen-id"
    generated = await client.get(FLUNDERS, headers=ALICE)
    assert len(generated.headers["Audit-Id"]) == 36
    assert events() == []


async def test_level_metadata(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata"))
    resp = await client.post(FLUNDERS, json=FLUNDER, headers=ALICE)
    assert resp.status == 201
    received, complete = events()
    audit_id = resp.headers["Audit-Id"]
    assert received == {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id,
        "stage": "RequestReceived",
        "requestURI": FLUNDERS,
        "verb": "create",
        "user": {"username": "alice", "groups": ["system:authenticated"]},
        "sourceIPs": ["127.0.0.1"],
        "userAgent": "kubectl/v1.33.0 (linux/amd64)",
        "objectRef": {
            "resource": "flunders",
            "namespace": "ns",
            "apiGroup": "wardle.example.com",
            "apiVersion": "v1alpha1",
        },
        "requestReceivedTimestamp": received["requestReceivedTimestamp"],
        "stageTimestamp": received["requestReceivedTimestamp"],
    }
    assert complete["stage"] == "ResponseComplete"
    assert complete["auditID"] == audit_id
    assert complete["responseStatus"] == {"metadata": {}, "code": 201}
    assert complete["annotations"] == {
        "authorization.k8s.io/decision": "allow",
        "authorization.k8s.io/reason": "RBAC: allowed",
    }
    assert "requestObject" not in complete and "responseObject" not in complete
    assert complete["stageTimestamp"] >= complete["requestReceivedTimestamp"]


async def test_level_request_records_the_request_object(audited: Start) -> None:
    client, events = await audited(policy_for("Request"))
    resp = await client.post(FLUNDERS + "?fieldManager=kubectl-create", json=FLUNDER, headers=ALICE)
    assert resp.status == 201
    received, complete = events()
    assert "requestObject" not in received
    assert complete["requestObject"] == FLUNDER
    assert "responseObject" not in complete
    # LogRequestObject: a create names its object only in the body
    assert complete["objectRef"]["name"] == "f1"
    assert complete["requestURI"] == FLUNDERS + "?fieldManager=kubectl-create"


async def test_level_request_response_records_both_objects(audited: Start) -> None:
    client, events = await audited(policy_for("RequestResponse"))
    resp = await client.post(FLUNDERS, json=FLUNDER, headers=ALICE)
    assert resp.status == 201
    _, complete = events()
    assert complete["requestObject"] == FLUNDER
    assert complete["responseObject"] == created(FLUNDER)
    assert complete["responseStatus"] == {"metadata": {}, "code": 201}


async def test_watch_gets_response_started_and_no_bodies(audited: Start) -> None:
    client, events = await audited(policy_for("RequestResponse"))
    resp = await client.get(FLUNDERS + "?watch=true", headers=ALICE)
    assert await resp.read() == b"".join(WATCH_EVENTS)
    recorded = events()
    assert stages(recorded) == ["RequestReceived", "ResponseStarted", "ResponseComplete"]
    assert [e["verb"] for e in recorded] == ["watch"] * 3
    assert recorded[1]["responseStatus"] == {"metadata": {}, "code": 200}
    assert all("responseObject" not in e and "requestObject" not in e for e in recorded)


async def test_a_body_over_the_limit_is_annotated_not_recorded(audited: Start) -> None:
    client, events = await audited(policy_for("RequestResponse"), body_limit=32)
    resp = await client.post(FLUNDERS, json=FLUNDER, headers=ALICE)
    assert resp.status == 201
    _, complete = events()
    assert "requestObject" not in complete and "responseObject" not in complete
    size = len(json.dumps(FLUNDER))
    assert complete["annotations"]["aggregator/request-object"] == (
        f"omitted: {size} bytes exceed the 32-byte audit body limit"
    )
    assert complete["annotations"]["aggregator/response-object"].startswith("omitted: ")


async def test_secrets_are_never_recorded(audited: Start) -> None:
    client, events = await audited(policy_for("RequestResponse"))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"token": "czNjcjN0"}}
    resp = await client.post("/api/v1/namespaces/ns/secrets", json=secret, headers=ALICE)
    assert resp.status == 201
    _, complete = events()
    assert "requestObject" not in complete and "responseObject" not in complete
    assert (
        complete["annotations"]["aggregator/request-object"] == "omitted: this resource carries credentials"
    )
    assert "czNjcjN0" not in json.dumps(events())


async def test_impersonation_keeps_the_requester_as_user(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata"))
    await client.get(FLUNDERS, headers={**ALICE, "Impersonate-User": "bob"})
    received, complete = events()
    assert "impersonatedUser" not in received  # impersonation runs after the RequestReceived stage
    assert complete["user"]["username"] == "alice"
    assert complete["impersonatedUser"] == {"username": "bob", "groups": ["system:authenticated"]}


async def test_gateway_status_answers_are_copied_into_response_status(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata"))
    resp = await client.get("/apis/wardle.example.com/v1alpha1/namespaces/forbidden/flunders", headers=ALICE)
    assert resp.status == 403
    _, complete = events()
    assert complete["responseStatus"] == {
        "metadata": {},
        "status": "Failure",
        "message": 'flunders.wardle.example.com is forbidden: User "alice" cannot list resource "flunders"',
        "reason": "Forbidden",
        "code": 403,
    }
    assert complete["annotations"]["authorization.k8s.io/decision"] == "forbid"


async def test_failed_authentication_is_one_response_started_event(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata"))
    resp = await client.get(FLUNDERS, headers={"Authorization": "Bearer not-a-valid-token"})
    assert resp.status == 401
    (event,) = events()
    assert event["stage"] == "ResponseStarted"
    assert event["user"] == {}
    assert event["responseStatus"] == {
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    assert "not-a-valid-token" not in json.dumps(event)


async def test_panic_stage(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata"))
    resp = await client.get("/apis/wardle.example.com/v1alpha1/explode", headers=ALICE)
    assert resp.status == 500
    _, panic = events()
    assert panic["stage"] == "Panic"
    assert panic["responseStatus"] == {
        "metadata": {},
        "status": "Failure",
        "message": "APIServer panic'd: kaboom",
        "reason": "InternalError",
        "code": 500,
    }


async def test_omitted_stages_are_not_written(audited: Start) -> None:
    client, events = await audited(policy_for("Metadata", omitStages=["RequestReceived"]))
    await client.get(FLUNDERS + "?watch=1", headers=ALICE)
    assert stages(events()) == ["ResponseStarted", "ResponseComplete"]


# --- the recorder without a server -------------------------------------------------------------


def record(policy: str, method: str, path: str, headers: dict[str, str] | None = None) -> AuditRequest:
    return recorded_with(policy, method, path, headers)[0]


def recorded_with(
    policy: str, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[AuditRequest, ListWriter]:
    auditor, writer = make_auditor(policy)
    request = mocked_request(method, path, headers)
    made = auditor.begin(request, UserInfo("alice"), info_of(request))
    assert made is not None
    return made, writer


@pytest.mark.parametrize(
    ("level", "request_tee", "response_tee"),
    [("Metadata", False, False), ("Request", True, False), ("RequestResponse", True, True)],
)
def test_captures_only_at_the_levels_that_record_bodies(
    level: str, request_tee: bool, response_tee: bool
) -> None:
    made = record(policy_for(level), "POST", FLUNDERS)
    assert (made.request_capture() is not None) is request_tee
    assert (made.response_capture() is not None) is response_tee


def test_no_capture_for_upgrades_or_long_running_requests() -> None:
    upgrade = {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"}
    exec_path = "/api/v1/namespaces/ns/pods/p/exec?command=sh"
    assert record(policy_for("RequestResponse"), "POST", exec_path, upgrade).request_capture() is None
    assert record(policy_for("RequestResponse"), "GET", FLUNDERS, upgrade).response_capture() is None
    assert (
        record(policy_for("RequestResponse"), "GET", "/api/v1/namespaces/ns/pods/p/log").response_capture()
        is None
    )


def test_the_first_status_code_stays_and_the_final_stage_is_written_once() -> None:
    """`auditResponseWriter.processCode` runs once: headers cannot change after they went out."""
    made, writer = recorded_with(policy_for("Metadata"), "GET", FLUNDERS)
    made.response_started(200)
    made.complete(500)
    made.complete(200)
    made.panic("late")
    assert [(e.stage.value, e.response_status) for e in writer.events] == [
        ("RequestReceived", None),
        ("ResponseComplete", ResponseStatus(code=200)),
    ]


def test_nothing_written_means_connection_closed_early() -> None:
    made, writer = recorded_with(policy_for("Metadata"), "GET", FLUNDERS)
    made.complete()
    assert writer.events[-1].response_status == ResponseStatus(200, "Success", "Connection closed early")


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/api/v1/pods?limit=5&watch=1", "/api/v1/pods?limit=5&watch=1"),
        ("/api/v1/pods?", "/api/v1/pods?"),
        ("/a%2Fb?x=%41", "/a%2Fb?x=%41"),  # as sent, escapes and all
        (
            "/api?access_token=abc.def&b=1&access_token",
            "/api?access_token=REDACTED&b=1&access_token=REDACTED",
        ),
    ],
)
def test_request_uri_is_the_target_as_sent_without_tokens(target: str, logged: str) -> None:
    made = record(policy_for("Metadata"), "GET", target)
    assert made.event.request_uri == logged


@pytest.mark.parametrize(
    ("target", "headers", "message"),
    [
        ("/api", {}, "Authentication failed, no credentials provided"),
        ("/api", {"Authorization": "Bearer s3cr3t"}, "Authentication failed, attempted: bearer"),
        ("/api", {"Authorization": "Basic dTpzM2NyM3Q="}, "Authentication failed, attempted: basic"),
        ("/api?access_token=s3cr3t", {}, "Authentication failed, attempted: access_token"),
    ],
)
def test_failed_authentication_names_what_was_tried_never_the_credential(
    target: str, headers: dict[str, str], message: str
) -> None:
    auditor, writer = make_auditor(policy_for("Metadata"))
    request = mocked_request("GET", target, headers)
    auditor.failed_authentication(request, info_of(request))
    (event,) = writer.events
    assert event.stage.value == "ResponseStarted"
    assert event.response_status == ResponseStatus(401, message=message)
    line = encode_event(event)
    assert b"s3cr3t" not in line and b"dTpzM2NyM3Q" not in line
