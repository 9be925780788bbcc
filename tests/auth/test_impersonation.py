"""Impersonation as `kubectl --as` meets it: reviews counted at the fake kube-apiserver, the
identity a fake extension server is told, and upstream's exact refusals."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggregator.auth.impersonation import requested, split_service_account
from aggregator.auth.modes import IMPERSONATION_HINT
from aggregator.model.userinfo import UserInfo
from aggregator.web.context import RequestContext
from aggregator.web.responses import json_response
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import Response
from tests.auth.conftest import GROUP_PREFIX, Reviewed, StartReviewed, add_test_routes
from tests.conftest import StartGateway
from tests.support.backend import (
    PREFIX,
    SERVER_NAME,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    make_backend_pki,
    wait_available,
    write_manifests,
)
from tests.support.fakereviews import Spec
from tests.support.pki import PKI

Headers = list[tuple[str, str]]

FLUNDER = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders/foo"
GET_FLUNDER = {
    "namespace": "default",
    "verb": "get",
    "group": "wardle.example.com",
    "version": "v1alpha1",
    "resource": "flunders",
    "name": "foo",
}
AUTHN = "authentication.k8s.io"
SA = "system:serviceaccount:kube-system:default"
WHO = "/impersonated"


def impersonate(
    resource: str, name: str, *, namespace: str = "", group: str = "", version: str = "", sub: str = ""
) -> dict[str, str]:
    """The resourceAttributes of one impersonation check, empty fields omitted as Go does."""
    attributes = {
        "namespace": namespace,
        "verb": "impersonate",
        "group": group,
        "version": version,
        "resource": resource,
        "subresource": sub,
        "name": name,
    }
    return {k: v for k, v in attributes.items() if v}


def asked(reviews: list[Spec]) -> list[tuple[str, dict[str, str]]]:
    return [(spec["user"], spec["resourceAttributes"]) for spec in reviews]


def status_bytes(code: int, reason: str, message: str, details: dict[str, str] | None = None) -> bytes:
    """A Status exactly as the gateway writes it (Go's field order, compact, newline-terminated)."""
    tail = f',"details":{json.dumps(details, separators=(",", ":"))}' if details is not None else ""
    return (
        f'{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure",'
        f'"message":{json.dumps(message)},"reason":"{reason}"{tail},"code":{code}}}\n'
    ).encode()


async def who(ctx: RequestContext) -> Response:
    user, requester = ctx.user, ctx.requester
    assert user is not None
    return json_response(
        ctx,
        {
            "name": user.name,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra.items()},
            "requester": requester.name if requester is not None else None,
        },
    )


async def call(reviewed: Reviewed, path: str, headers: Headers, *, cert: str = "alice") -> tuple[int, bytes]:
    """A request carrying repeated headers in exactly this order (as kubectl sends them)."""
    async with reviewed.call.session.get(
        reviewed.server.url + path, ssl=reviewed.call.context(cert), headers=headers
    ) as resp:
        return resp.status, await resp.read()


@pytest.fixture
async def impersonating(start_reviewed: StartReviewed) -> AsyncIterator[Reviewed]:
    """A reviewing gateway with the impersonation gate; reviews are never cached unless asked."""
    reviewed = await start_reviewed(
        authorization_webhook_cache_authorized_ttl=0.0, authorization_webhook_cache_unauthorized_ttl=0.0
    )
    reviewed.server.gateway.router.add_exact(WHO, Route(who, RouteKind.OWN, "who"))
    yield reviewed


# --- which reviews, in which order -----------------------------------------------------------------

REVIEW_CASES: dict[str, tuple[Headers, list[tuple[str, dict[str, str]]]]] = {
    "user": (
        [("Impersonate-User", "bob")],
        [("alice", impersonate("users", "bob")), ("bob", GET_FLUNDER)],
    ),
    "service account": (
        [("Impersonate-User", SA)],
        [("alice", impersonate("serviceaccounts", "default", namespace="kube-system")), (SA, GET_FLUNDER)],
    ),
    "three parts is a user name": (
        [("Impersonate-User", SA + ":x")],
        [("alice", impersonate("users", SA + ":x")), (SA + ":x", GET_FLUNDER)],
    ),
    "user, groups, extras, uid in upstream's order, whatever the header order": (
        [
            # (aiohttp's client keeps repeated names only when spelled alike: see the pure tests)
            ("Impersonate-Uid", "1234"),
            ("IMPERSONATE-EXTRA-SCOPES", "view"),
            ("impersonate-group", "devs"),
            ("Impersonate-User", "bob"),
            ("IMPERSONATE-EXTRA-SCOPES", "edit"),
            ("impersonate-group", "ops"),
            ("Impersonate-Extra-Example.com%2FTeam", "blue"),
        ],
        [
            ("alice", impersonate("users", "bob")),
            ("alice", impersonate("groups", "devs")),
            ("alice", impersonate("groups", "ops")),
            ("alice", impersonate("userextras", "view", group=AUTHN, version="v1", sub="scopes")),
            ("alice", impersonate("userextras", "edit", group=AUTHN, version="v1", sub="scopes")),
            ("alice", impersonate("userextras", "blue", group=AUTHN, version="v1", sub="example.com/team")),
            ("alice", impersonate("uids", "1234", group=AUTHN, version="v1")),
            ("bob", GET_FLUNDER),
        ],
    ),
}


@pytest.mark.parametrize("case", REVIEW_CASES, ids=list(REVIEW_CASES))
async def test_each_impersonated_item_is_reviewed_for_the_caller_then_the_request_as_the_target(
    impersonating: Reviewed, case: str
) -> None:
    headers, expected = REVIEW_CASES[case]
    status, body = await call(impersonating, FLUNDER, headers)
    assert status == 200, body
    assert asked(impersonating.reviews.access_reviews) == expected


async def test_impersonation_checks_carry_the_whole_caller_and_the_request_the_whole_target(
    impersonating: Reviewed,
) -> None:
    headers, _ = REVIEW_CASES["user, groups, extras, uid in upstream's order, whatever the header order"]
    assert (await call(impersonating, FLUNDER, headers))[0] == 200
    first, *_, last = impersonating.reviews.access_reviews
    # The caller as authenticated, credential id included.
    assert first["user"] == "alice"
    assert first["groups"] == ["devs", "system:authenticated"]
    assert list(first["extra"]) == ["authentication.kubernetes.io/credential-id"]
    assert "uid" not in first
    # The request itself: the impersonated user and nothing of alice's.
    assert last == {
        "resourceAttributes": GET_FLUNDER,
        "user": "bob",
        "groups": ["devs", "ops", "system:authenticated"],
        "extra": {"example.com/team": ["blue"], "scopes": ["view", "edit"]},
        "uid": "1234",
    }


# --- refusals, word for word ---------------------------------------------------------------------------

DENIAL_CASES: dict[str, tuple[Headers, str, str, dict[str, str]]] = {
    "user": (
        [("Impersonate-User", "bob")],
        "users",
        'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" '
        "at the cluster scope",
        {"name": "bob", "kind": "users"},
    ),
    "service account": (
        [("Impersonate-User", SA)],
        "serviceaccounts",
        'serviceaccounts "default" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" '
        'in API group "" in the namespace "kube-system"',
        {"name": "default", "kind": "serviceaccounts"},
    ),
    "group": (
        [("Impersonate-User", "bob"), ("Impersonate-Group", "system:masters")],
        "groups",
        'groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups" in API '
        'group "" at the cluster scope',
        {"name": "system:masters", "kind": "groups"},
    ),
    "extra": (
        [("Impersonate-User", "bob"), ("Impersonate-Extra-Scopes", "admin")],
        "userextras",
        'userextras.authentication.k8s.io "admin" is forbidden: User "alice" cannot impersonate resource '
        '"userextras/scopes" in API group "authentication.k8s.io" at the cluster scope',
        {"name": "admin", "group": AUTHN, "kind": "userextras"},
    ),
    "uid": (
        [("Impersonate-User", "bob"), ("Impersonate-Uid", "1234")],
        "uids",
        'uids.authentication.k8s.io "1234" is forbidden: User "alice" cannot impersonate resource "uids" '
        'in API group "authentication.k8s.io" at the cluster scope',
        {"name": "1234", "group": AUTHN, "kind": "uids"},
    ),
}


def deny_resource(reviewed: Reviewed, resource: str, reason: str = "") -> None:
    def policy(spec: Spec) -> dict[str, Any]:
        if spec["resourceAttributes"].get("resource") != resource:
            return {"allowed": True}
        return {"allowed": False, **({"reason": reason} if reason else {})}

    reviewed.reviews.policy = policy


@pytest.mark.parametrize("case", DENIAL_CASES, ids=list(DENIAL_CASES))
async def test_a_refused_item_gets_upstreams_403_and_stops_the_checks(
    impersonating: Reviewed, case: str
) -> None:
    headers, resource, message, details = DENIAL_CASES[case]
    deny_resource(impersonating, resource)
    assert await call(impersonating, FLUNDER, headers) == (
        403,
        status_bytes(403, "Forbidden", message, details),
    )
    reviewed = asked(impersonating.reviews.access_reviews)
    assert reviewed[-1][1]["resource"] == resource  # nothing asked after the refusal
    assert all(user == "alice" for user, _ in reviewed)


async def test_the_reviews_reason_is_appended_and_a_failed_review_refuses(impersonating: Reviewed) -> None:
    message = (
        'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" '
        "at the cluster scope"
    )
    details = {"name": "bob", "kind": "users"}
    deny_resource(impersonating, "users", reason="ask the platform team")
    assert await call(impersonating, FLUNDER, [("Impersonate-User", "bob")]) == (
        403,
        status_bytes(403, "Forbidden", message + ": ask the platform team", details),
    )
    # Upstream refuses when the authorizer errs (`err != nil || decision != allow`), with its
    # empty reason; it is not the 500 an ordinary request gets.
    impersonating.reviews.fail_with(403, "Forbidden", "cannot create subjectaccessreviews")
    assert await call(impersonating, FLUNDER, [("Impersonate-User", "bob")]) == (
        403,
        status_bytes(403, "Forbidden", message, details),
    )


NO_USER_CASES: dict[str, tuple[Headers, str]] = {
    "group": ([("Impersonate-Group", "devs")], "[{Group  devs    }]"),
    "extra": (
        [("Impersonate-Extra-Scopes", "view")],
        "[{UserExtra  view  authentication.k8s.io/v1  scopes}]",
    ),
    "uid": ([("Impersonate-Uid", "1234")], "[{UID  1234  authentication.k8s.io/v1  }]"),
    "empty user": (
        [
            ("Impersonate-User", ""),
            ("Impersonate-Group", "a"),
            ("Impersonate-Group", "b"),
            ("Impersonate-Uid", "7"),
        ],
        "[{Group  a    } {Group  b    } {UID  7  authentication.k8s.io/v1  }]",
    ),
}


@pytest.mark.parametrize("case", NO_USER_CASES, ids=list(NO_USER_CASES))
async def test_groups_extras_or_uid_without_a_user_are_upstreams_500(
    impersonating: Reviewed, case: str
) -> None:
    headers, refs = NO_USER_CASES[case]
    path = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders?limit=1"
    message = f'Internal Server Error: "{path}": requested {refs} without impersonating a user'
    assert await call(impersonating, path, headers) == (500, status_bytes(500, "InternalError", message))
    assert impersonating.reviews.access_reviews == []


# --- who the request runs as ---------------------------------------------------------------------------

USER_CASES: dict[str, tuple[Headers, UserInfo]] = {
    "user": ([("Impersonate-User", "bob")], UserInfo("bob", groups=("system:authenticated",))),
    "groups are the given ones": (
        [("Impersonate-User", "bob"), ("Impersonate-Group", "devs"), ("Impersonate-Group", "devs")],
        UserInfo("bob", groups=("devs", "devs", "system:authenticated")),
    ),
    "system:authenticated given": (
        [
            ("Impersonate-User", "bob"),
            ("Impersonate-Group", "system:authenticated"),
            ("Impersonate-Group", "x"),
        ],
        UserInfo("bob", groups=("system:authenticated", "x")),
    ),
    "system:unauthenticated given": (
        [("Impersonate-User", "bob"), ("Impersonate-Group", "system:unauthenticated")],
        UserInfo("bob", groups=("system:unauthenticated",)),
    ),
    "service account gets its groups": (
        [("Impersonate-User", SA)],
        UserInfo(
            SA,
            groups=("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
        ),
    ),
    "service account with groups gets only those": (
        [("Impersonate-User", SA), ("Impersonate-Group", "devs")],
        UserInfo(SA, groups=("devs", "system:authenticated")),
    ),
    "anonymous": (
        [("Impersonate-User", "system:anonymous")],
        UserInfo("system:anonymous", groups=("system:unauthenticated",)),
    ),
    "anonymous with groups": (
        [("Impersonate-User", "system:anonymous"), ("Impersonate-Group", "system:authenticated")],
        UserInfo("system:anonymous", groups=("system:authenticated", "system:unauthenticated")),
    ),
    "extras and uid": (
        [
            ("Impersonate-User", "bob"),
            ("Impersonate-Extra-Scopes", "view"),
            ("impersonate-extra-scopes", "edit"),
            ("Impersonate-Extra-Bad%zzKey", "x"),
            ("Impersonate-Uid", "1234"),
            ("Impersonate-Uid", "ignored"),
        ],
        UserInfo(
            "bob",
            "1234",
            ("system:authenticated",),
            {"scopes": ("view", "edit"), "bad%zzkey": ("x",)},
        ),
    ),
}


@pytest.mark.parametrize("case", USER_CASES, ids=list(USER_CASES))
def test_the_impersonated_user_is_what_the_headers_say(case: str) -> None:
    headers, expected = USER_CASES[case]
    wanted = requested(headers)
    assert wanted is not None
    assert wanted.user() == expected


def test_no_impersonation_headers_means_no_impersonation() -> None:
    assert requested([("Accept", "application/json"), ("Impersonate-Other", "x")]) is None
    assert requested([("Impersonate-User", "")]) is None  # upstream: nothing requested


@pytest.mark.parametrize(
    ("username", "expected"),
    [
        (SA, ("kube-system", "default")),
        ("system:serviceaccount:ns:my.account", ("ns", "my.account")),
        ("system:serviceaccount:ns.dotted:name", None),  # a namespace is a DNS label
        ("system:serviceaccount:Ns:name", None),
        ("system:serviceaccount:ns:", None),
        ("system:serviceaccount:ns:a:b", None),
        ("system:serviceaccount:" + "n" * 64 + ":name", None),
        ("system:serviceaccounts:ns", None),
    ],
)
def test_service_account_names_follow_split_username(username: str, expected: tuple[str, str] | None) -> None:
    assert split_service_account(username) == expected


async def test_the_request_runs_as_the_target_and_remembers_the_caller(impersonating: Reviewed) -> None:
    status, body = await call(
        impersonating, WHO, [("Impersonate-User", SA), ("Impersonate-Extra-Scopes", "view")]
    )
    assert status == 200
    assert json.loads(body) == {
        "name": SA,
        "uid": "",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
        "extra": {"scopes": ["view"]},
        "requester": "alice",
    }
    status, body = await call(impersonating, WHO, [])
    assert json.loads(body)["requester"] is None


# --- the authorizer's own rules and cache ---------------------------------------------------------------


async def test_a_second_identical_request_makes_no_new_review(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    headers = [("Impersonate-User", "bob"), ("Impersonate-Group", "devs")]
    assert (await call(reviewed, FLUNDER, headers))[0] == 200
    assert len(reviewed.reviews.access_reviews) == 3
    hits = reviewed.metric("aggregator_authorization_cache_total", result="hit")
    assert (await call(reviewed, FLUNDER, headers))[0] == 200
    assert len(reviewed.reviews.access_reviews) == 3
    assert reviewed.metric("aggregator_authorization_cache_total", result="hit") == hits + 3


async def test_always_allowed_groups_may_impersonate_without_a_review(impersonating: Reviewed) -> None:
    # admin is in system:masters: only bob's own request is reviewed.
    assert (await call(impersonating, FLUNDER, [("Impersonate-User", "bob")], cert="admin"))[0] == 200
    assert asked(impersonating.reviews.access_reviews) == [("bob", GET_FLUNDER)]


async def test_routes_kube_apiserver_serves_are_left_to_it(impersonating: Reviewed) -> None:
    status, body = await call(impersonating, "/delegated", [("Impersonate-User", "bob")])
    assert (status, json.loads(body)["name"]) == (200, "alice")
    assert impersonating.reviews.access_reviews == []


async def test_without_an_authorizer_impersonation_is_refused_and_says_how_to_enable_it(
    start_gateway: StartGateway, users: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    """Local mode with no kubeconfig and no RBAC manifests still serves every authenticated
    caller, but nothing authorizes impersonation: upstream's 403, with a reason saying what would."""
    with caplog.at_level(logging.WARNING, logger="aggregator.auth.build"):
        server = await start_gateway()
    add_test_routes(server)
    assert any(r.getMessage().startswith("NO RBAC MANIFESTS in --apiservices-dir") for r in caplog.records)
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + FLUNDER, ssl=users.client_context("bob")) as resp:
            assert (resp.status, await resp.json()) == (200, {"name": "bob", "groups": ["system:authenticated"]})
        async with session.get(
            server.url + FLUNDER,
            ssl=users.client_context("bob"),
            headers=[("Impersonate-User", "alice"), ("Impersonate-Group", "system:masters")],
        ) as resp:
            status, body = resp.status, await resp.read()
    message = (
        'users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the '
        f"cluster scope: {IMPERSONATION_HINT}"
    )
    assert (status, body) == (403, status_bytes(403, "Forbidden", message, {"name": "alice", "kind": "users"}))


# --- through to an extension API server -------------------------------------------------------------------

THINGS = f"{PREFIX}/namespaces/default/things"
EXEC = f"{THINGS}/t1/exec"


@dataclass
class Aggregated:
    reviewed: Reviewed
    backend: FakeBackend

    def impersonate_headers_seen(self) -> list[str]:
        return [
            k for r in self.backend.received for k, _ in r.headers if k.lower().startswith("impersonate-")
        ]


@pytest.fixture
async def aggregated(
    start_reviewed: StartReviewed, users: PKI, tmp_path: Path, apiservices_dir: Path
) -> AsyncIterator[Aggregated]:
    """The demo APIService on a recording backend, behind a reviewing gateway with the gate."""
    (tmp_path / "backend-pki").mkdir()
    backend_pki = make_backend_pki(tmp_path / "backend-pki")
    cert, key = backend_pki.serving("api", [SERVER_NAME])
    backend = FakeBackend(cert, key, users.path("front-proxy-ca.crt"))
    await backend.start()
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    try:
        reviewed = await start_reviewed()
        await wait_available(reviewed.server)
        yield Aggregated(reviewed, backend)
    finally:
        await backend.stop()


async def test_the_backend_is_told_the_impersonated_user_and_never_the_headers(
    aggregated: Aggregated,
) -> None:
    headers = [
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "devs"),
        ("impersonate-extra-Scopes", "view"),
        ("IMPERSONATE-UID", "1234"),
    ]
    status, body = await call(aggregated.reviewed, THINGS, headers, cert="bob")
    assert status == 200, body
    assert json.loads(body) == {"path": THINGS, "user": "alice", "groups": ["devs", "system:authenticated"]}
    (seen,) = aggregated.backend.seen_by("alice")
    assert seen.all("X-Remote-User") == ["alice"]
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert seen.all("X-Remote-Uid") == ["1234"]
    assert seen.all("X-Remote-Extra-Scopes") == ["view"]
    assert [k for k, _ in seen.headers if k.lower().startswith("x-remote-extra-")] == [
        "X-Remote-Extra-Scopes"
    ]
    assert aggregated.impersonate_headers_seen() == []
    list_things = {"namespace": "default", "verb": "list", "group": "demo.example.com", "version": "v1"}
    assert asked(aggregated.reviewed.reviews.access_reviews) == [
        ("bob", impersonate("users", "alice")),
        ("bob", impersonate("groups", "devs")),
        ("bob", impersonate("userextras", "view", group=AUTHN, version="v1", sub="scopes")),
        ("bob", impersonate("uids", "1234", group=AUTHN, version="v1")),
        ("alice", {**list_things, "resource": "things"}),
    ]


async def test_a_refused_impersonation_never_reaches_the_backend(aggregated: Aggregated) -> None:
    deny_resource(aggregated.reviewed, "groups")
    headers = [("Impersonate-User", "alice"), ("Impersonate-Group", "system:masters")]
    message = (
        'groups "system:masters" is forbidden: User "bob" cannot impersonate resource "groups" in API '
        'group "" at the cluster scope'
    )
    assert await call(aggregated.reviewed, THINGS, headers, cert="bob") == (
        403,
        status_bytes(403, "Forbidden", message, {"name": "system:masters", "kind": "groups"}),
    )
    assert aggregated.backend.seen_by("alice") == aggregated.backend.seen_by("bob") == []


async def test_an_upgrade_runs_as_the_impersonated_user(aggregated: Aggregated) -> None:
    async def exec_ws(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_bytes(msg.data.upper())
        return ws

    aggregated.backend.routes[EXEC] = exec_ws
    reviewed = aggregated.reviewed
    async with reviewed.call.session.ws_connect(
        reviewed.server.url + EXEC + "?command=sh",
        protocols=("v5.channel.k8s.io",),
        ssl=reviewed.call.context("bob"),
        headers=[("Impersonate-User", "alice"), ("Impersonate-Group", "devs")],
    ) as ws:
        await ws.send_bytes(b"\x00ls\n")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == b"\x00LS\n"
    (seen,) = aggregated.backend.seen_by("alice")
    assert seen.one("Upgrade") == "websocket"
    assert seen.all("X-Remote-Group") == ["devs", "system:authenticated"]
    assert aggregated.impersonate_headers_seen() == []
    assert asked(reviewed.reviews.access_reviews)[:2] == [
        ("bob", impersonate("users", "alice")),
        ("bob", impersonate("groups", "devs")),
    ]

    # A refused upgrade is answered before any tunnel exists.
    deny_resource(reviewed, "groups")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await reviewed.call.session.ws_connect(
            reviewed.server.url + EXEC + "?command=sh",
            ssl=reviewed.call.context("bob"),
            headers=[("Impersonate-User", "alice"), ("Impersonate-Group", "system:masters")],
        )
    assert refused.value.status == 403
    assert len(aggregated.backend.seen_by("alice")) == 1
