"""A caller without rights tries to become someone else, against `aggregator serve` as shipped.

Every attack runs on every worker (`--workers 1` and `--workers 2`), in kube mode (impersonation
checked by SubjectAccessReviews at the fake kube-apiserver), in local mode with RBAC manifests in
the folder, and in local mode with no authorizer at all (no kubeconfig, no RBAC manifests), where
impersonation must be refused outright. The client writes raw bytes (header names spelled any
way, upgrades) and the recording backend says what reached it: nothing of a refused request, and
never an `Impersonate-*` header.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aggregator.auth.modes import IMPERSONATION_HINT
from tests.support.backend import (
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    endpointslice_manifest,
    service_manifest,
    write_manifests,
)
from tests.support.fakekube import FakeKube
from tests.support.fakeopenapi import KubeOpenAPI
from tests.support.fakereviews import FakeReviews, Spec
from tests.support.kubestack import builtin_v2, builtin_v3, serve_discovery
from tests.support.pki import PKI
from tests.support.rawhttp import on_worker, request_bytes
from tests.support.rbac import cluster_role, cluster_role_binding, may_impersonate, rule, user
from tests.workers.group import Group, running_group

pytestmark = pytest.mark.long(20)

THINGS = f"{PREFIX}/namespaces/default/things"
EXEC = f"{THINGS}/t1/exec?command=sh"
WEBSOCKET = [
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
]
SPDY = [
    ("Connection", "Upgrade"),
    ("Upgrade", "SPDY/3.1"),
    ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
]

RBAC_MANIFESTS = [
    cluster_role("things-reader", rule(["get", "list"], ["demo.example.com"], ["things"])),
    cluster_role_binding("readers", "things-reader", user("alice"), user("bob")),
    *may_impersonate("alice", "bob"),
]


def kube_policy(spec: Spec) -> dict[str, Any]:
    """The fake cluster's authorizer: what RBAC_MANIFESTS grant."""
    attributes = spec.get("resourceAttributes") or {}
    user = spec.get("user")
    if attributes.get("verb") == "impersonate":
        allowed = (
            user == "alice" and attributes.get("resource") == "users" and attributes.get("name") == "bob"
        )
        return {"allowed": allowed}
    return {"allowed": user in ("alice", "bob") and attributes.get("resource") == "things"}


@dataclass
class Setup:
    name: str  # kube, local-rbac, local-none
    group: Group
    backend: FakeBackend
    workers: int

    @property
    def checked(self) -> bool:
        """Whether an authorizer can grant impersonation (alice may become bob)."""
        return self.name != "local-none"

    def refusal(self, resource: str, name: str) -> str:
        message = (
            f'{resource} "{name}" is forbidden: User "alice" cannot impersonate resource "{resource}" in API '
            'group "" at the cluster scope'
        )
        return message if self.checked else f"{message}: {IMPERSONATION_HINT}"


CASES = [(name, workers) for name in ("kube", "local-rbac", "local-none") for workers in (1, 2)]


@pytest.fixture(params=CASES, ids=[f"{n}-workers-{w}" for n, w in CASES])
async def setup(
    request: pytest.FixtureRequest,
    users: PKI,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    apiservices_dir: Path,
    fake_kube: FakeKube,
    tmp_path: Path,
) -> AsyncIterator[Setup]:
    name, workers = request.param
    registration = [
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        service_manifest(port=backend.port),
        endpointslice_manifest("api-1", [("127.0.0.1", True)], port=backend.port),
    ]
    extra = ["--workers", str(workers)]
    folder: Path | None = apiservices_dir
    if name == "kube":
        FakeReviews(fake_kube).policy = kube_policy
        serve_discovery(fake_kube)
        KubeOpenAPI(fake_kube, builtin_v3(), builtin_v2())
        for doc, resource in zip(registration, ("apiservices", "services", "endpointslices"), strict=True):
            fake_kube.add_object(resource, doc)
        folder = None
        extra += [
            "--kubeconfig",
            str(fake_kube.kubeconfig),
            "--authentication-skip-lookup",
            "--backend-deny-cidrs",
            "169.254.0.0/16,fe80::/10",  # the backend listens on loopback
        ]
    else:
        write_manifests(apiservices_dir, "demo", registration[0], *backend_service(backend.port))
        if name == "local-rbac":
            write_manifests(apiservices_dir, "rbac", *RBAC_MANIFESTS)
    async with running_group(users, folder, tmp_path / "gateway.log", *extra) as group:
        yield Setup(name, group, backend, workers)


async def attack(setup: Setup, data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """`data` sent as alice on a connection to each worker: (status, JSON body) per worker."""
    answers = []
    for worker in range(setup.workers):
        connection = await on_worker(setup.group.port, setup.group.pki, worker, cert="alice")
        try:
            answer = await connection.exchange(data)
        finally:
            connection.close()
        answers.append((answer.status, json.loads(answer.body) if answer.body else {}))
    return answers


def callers_seen(backend: FakeBackend) -> list[str]:
    """Who the backend was told each request is for, the gateway's own calls left out."""
    return [
        user for r in backend.received for user in r.all("X-Remote-User") if user != "system:kube-aggregator"
    ]


def impersonation_headers_seen(backend: FakeBackend) -> list[str]:
    return [
        k
        for r in backend.received
        for k, _ in r.headers
        if k.lower().replace("_", "-").startswith("impersonate-")
    ]


async def test_impersonation_needs_an_authorizer_on_every_worker(setup: Setup) -> None:
    """One gateway per setup, every attack in turn (each section says what it shows)."""
    await refused_unless_an_authorizer_grants_it(setup)
    await granted_impersonation_reaches_the_backend_as_the_target_only(setup)
    setup.backend.received.clear()
    await a_look_alike_header_impersonates_nobody_and_never_reaches_the_backend(setup)


async def refused_unless_an_authorizer_grants_it(setup: Setup) -> None:
    get_things = request_bytes(
        "GET", THINGS, [("Impersonate-User", "root"), ("Impersonate-Group", "system:masters")]
    )
    for status, body in await attack(setup, get_things):
        assert (status, body["reason"], body["message"]) == (403, "Forbidden", setup.refusal("users", "root"))
        assert body["details"] == {"name": "root", "kind": "users"}

    # Spelled in lower case: the same header, the same refusal.
    lowered = request_bytes("GET", THINGS, [("impersonate-user", "root")])
    assert [s for s, _ in await attack(setup, lowered)] == [403] * setup.workers

    # A user alice may become, with a group she may not add: refused at the group (or at the user
    # when nothing authorizes impersonation at all).
    with_masters = request_bytes(
        "GET", THINGS, [("Impersonate-User", "bob"), ("Impersonate-Group", "system:masters")]
    )
    expected = setup.refusal("groups", "system:masters") if setup.checked else setup.refusal("users", "bob")
    assert [(s, b["message"]) for s, b in await attack(setup, with_masters)] == [
        (403, expected)
    ] * setup.workers

    # Groups without a user: upstream's 500, before any check.
    groups_only = request_bytes("GET", THINGS, [("Impersonate-Group", "system:masters")])
    assert [s for s, _ in await attack(setup, groups_only)] == [500] * setup.workers

    # Upgrades are checked like any request: no tunnel, no backend connection.
    for upgrade, method in ((WEBSOCKET, "GET"), (SPDY, "POST")):
        tunnel = request_bytes(method, EXEC, [*upgrade, ("Impersonate-User", "root")])
        for status, body in await attack(setup, tunnel):
            assert (status, body["message"]) == (403, setup.refusal("users", "root"))

    # Nothing reached the backend but the gateway's own discovery and availability calls.
    assert callers_seen(setup.backend) == []
    assert impersonation_headers_seen(setup.backend) == []


async def granted_impersonation_reaches_the_backend_as_the_target_only(setup: Setup) -> None:
    as_bob = request_bytes("GET", THINGS, [("Impersonate-User", "bob")])
    answers = await attack(setup, as_bob)
    if not setup.checked:
        assert [(s, b["message"]) for s, b in answers] == [
            (403, setup.refusal("users", "bob"))
        ] * setup.workers
        assert setup.backend.seen_by("bob") == []
        return
    assert (
        answers
        == [(200, {"path": THINGS, "user": "bob", "groups": ["system:authenticated"]})] * setup.workers
    )
    assert callers_seen(setup.backend) == ["bob"] * setup.workers
    assert impersonation_headers_seen(setup.backend) == []


async def a_look_alike_header_impersonates_nobody_and_never_reaches_the_backend(setup: Setup) -> None:
    """`Impersonate_User` is not impersonation to the gateway, and a CGI backend would read it as
    `Impersonate-User`: it is dropped, and the request runs as alice."""
    look_alike = request_bytes(
        "GET", THINGS, [("Impersonate_User", "root"), ("IMPERSONATE_GROUP", "system:masters")]
    )
    answers = await attack(setup, look_alike)
    assert (
        answers
        == [(200, {"path": THINGS, "user": "alice", "groups": ["devs", "system:authenticated"]})]
        * setup.workers
    )
    assert impersonation_headers_seen(setup.backend) == []
    assert callers_seen(setup.backend) == ["alice"] * setup.workers
