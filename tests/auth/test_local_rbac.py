"""Local mode authorizes with the RBAC manifests of its folder, reloaded like the rest of it.

A running gateway over TLS, a folder the test edits: a grant takes effect on reload, a broken file
or an invalid object is reported (file, line or field) while the last good rules stay in force, a
broken RBAC file never lets the gateway fall back to allowing everyone, `kubectl auth can-i`'s
self reviews answer from the same rules, and with `--workers 2` a worker started after a bad
edit authorizes exactly as its siblings do.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.auth.modes import IMPERSONATION_HINT
from aggregator.auth.rbacfolder import RBACFolder
from aggregator.runners.server import GatewayServer
from aggregator.util.flags import ConfigError
from tests.auth.conftest import GROUP_PREFIX, add_test_routes
from tests.conftest import StartGateway
from tests.support.gateway import local_options
from tests.support.logrecords import fields_of
from tests.support.pki import PKI
from tests.support.polling import until, until_async
from tests.support.rawhttp import on_worker, request_bytes
from tests.workers.group import running_group

V1 = "rbac.authorization.k8s.io/v1"
FLUNDERS = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SSRR = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"


def reader_role(verbs: str = "get,list") -> str:
    return f"""apiVersion: {V1}
kind: ClusterRole
metadata: {{name: flunder-reader}}
rules:
- apiGroups: [wardle.example.com]
  resources: [flunders]
  verbs: [{verbs}]
"""


def binding_to(*users: str) -> str:
    subjects = "".join(f"\n- {{kind: User, name: {u}}}" for u in users)
    return f"""apiVersion: {V1}
kind: ClusterRoleBinding
metadata: {{name: flunder-readers}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flunder-reader}}
subjects:{subjects}
"""


@dataclass
class Local:
    server: GatewayServer
    folder: Path
    users: PKI
    session: aiohttp.ClientSession

    @property
    def rbac(self) -> RBACFolder:
        rbac = self.server.gateway.control.rbac
        assert rbac is not None
        return rbac

    async def call(
        self,
        path: str,
        cert: str = "alice",
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> tuple[int, Any]:
        async with self.session.request(
            method, self.server.url + path, ssl=self.users.client_context(cert), headers=headers or {}, **kw
        ) as resp:
            body = await resp.read()
            return resp.status, json.loads(body) if body else None

    async def write(self, name: str, text: str) -> None:
        """Write a file of the folder and wait until the gateway has read it."""
        before = self.rbac.current
        path = self.folder / name
        path.write_text(text)
        self.rbac.reload()
        await until(lambda: self.rbac.current is not before, what=f"{name} to be read")

    async def can_i(self, cert: str, verb: str, resource: str, **extra: str) -> dict[str, Any]:
        review = {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": {
                "resourceAttributes": {
                    "namespace": "default",
                    "verb": verb,
                    "group": "wardle.example.com",
                    "resource": resource,
                    **extra,
                }
            },
            "status": {"allowed": False},
        }
        status, body = await self.call(SSAR, cert, method="POST", json=review)
        assert status == 201, body
        return dict(body)


@pytest.fixture
async def local(start_gateway: StartGateway, users: PKI, apiservices_dir: Path) -> AsyncIterator[Local]:
    (apiservices_dir / "rbac.yaml").write_text(reader_role() + "---\n" + binding_to("alice"))
    server = await start_gateway()
    add_test_routes(server)
    async with aiohttp.ClientSession() as session:
        yield Local(server, apiservices_dir, users, session)


def forbidden_list(user: str) -> str:
    return (
        f'flunders.wardle.example.com is forbidden: User "{user}" cannot list resource "flunders" in API group '
        '"wardle.example.com" in the namespace "default"'
    )


async def test_the_folders_rbac_decides_and_an_edit_takes_effect(local: Local) -> None:
    assert (await local.call(FLUNDERS, "alice"))[0] == 200
    status, body = await local.call(FLUNDERS, "bob")
    assert (status, body["message"], body["details"]) == (
        403,
        forbidden_list("bob"),
        {"group": "wardle.example.com", "kind": "flunders"},
    )
    # the built-in roles: discovery, and asking what one may do
    assert (await local.call("/version", "bob"))[0] == 200
    assert (await local.call("/metrics", "bob"))[0] == 403

    await local.write("rbac.yaml", reader_role() + "---\n" + binding_to("alice", "bob"))
    assert (await local.call(FLUNDERS, "bob"))[0] == 200


async def test_a_broken_file_keeps_its_last_good_rules_and_says_where(
    local: Local, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aggregator.auth.rbacfolder")
    await local.write("rbac.yaml", reader_role() + "---\n" + binding_to("alice") + "  - {kind: User\n")
    (record,) = [r for r in caplog.records if "RBAC manifest file not loaded" in r.getMessage()]
    assert fields_of(record)["file"] == str(local.folder / "rbac.yaml")
    assert fields_of(record)["reason"].startswith(f"{local.folder / 'rbac.yaml'}:")
    assert (await local.call(FLUNDERS, "alice"))[0] == 200  # the rules it held stay
    assert (await local.call(FLUNDERS, "bob"))[0] == 403


async def test_an_invalid_object_is_refused_with_kube_apiservers_message_and_its_last_version_stays(
    local: Local, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="aggregator.auth.rbacfolder")
    role_without_verbs = reader_role().replace("  verbs: [get,list]\n", "")
    await local.write("rbac.yaml", role_without_verbs + "---\n" + binding_to("alice", "bob"))
    (record,) = [r for r in caplog.records if "RBAC manifest refused" in r.getMessage()]
    assert record.getMessage() == "RBAC manifest refused; its previous version stays in force"
    assert fields_of(record) == {
        "file": str(local.folder / "rbac.yaml"),
        "document": 0,
        "reason": 'ClusterRole.rbac.authorization.k8s.io "flunder-reader" is invalid: rules[0].verbs: Required '
        "value: verbs must contain at least one value",
    }
    # the old role still grants, and the (valid) new binding already applies to bob
    assert (await local.call(FLUNDERS, "alice"))[0] == 200
    assert (await local.call(FLUNDERS, "bob"))[0] == 200


async def test_without_rbac_manifests_every_caller_is_allowed_but_impersonation(
    local: Local, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.auth.build")
    before = local.rbac.current
    (local.folder / "rbac.yaml").unlink()
    local.rbac.reload()
    await until(lambda: local.rbac.current is not before, what="the removal to be read")
    assert any(r.getMessage().startswith("NO RBAC MANIFESTS") for r in caplog.records)
    assert (await local.call(FLUNDERS, "bob"))[0] == 200
    status, body = await local.call(FLUNDERS, "bob", headers={"Impersonate-User": "alice"})
    assert (status, body["message"]) == (
        403,
        'users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the '
        f"cluster scope: {IMPERSONATION_HINT}",
    )


async def test_a_broken_rbac_file_at_start_never_falls_back_to_allowing_everyone(
    start_gateway: StartGateway, users: PKI, apiservices_dir: Path
) -> None:
    (apiservices_dir / "rbac.yaml").write_text(
        reader_role() + "---\n" + binding_to("alice") + "  - {kind: User\n"
    )
    server = await start_gateway()
    add_test_routes(server)
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + FLUNDERS, ssl=users.client_context("alice")) as resp:
            assert resp.status == 403
        async with session.get(server.url + "/apis", ssl=users.client_context("alice")) as resp:
            assert resp.status == 200  # the built-in roles still let her discover


async def test_kubectl_auth_can_i_gets_the_gateways_own_decision(local: Local) -> None:
    alice = await local.can_i("alice", "list", "flunders")
    assert alice["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by ClusterRoleBinding "flunder-readers" of ClusterRole "flunder-reader" to User "alice"',
    }
    assert alice["spec"] == {
        "resourceAttributes": {
            "namespace": "default",
            "verb": "list",
            "group": "wardle.example.com",
            "resource": "flunders",
        }
    }
    assert alice["metadata"] == {"creationTimestamp": None}
    assert (await local.can_i("alice", "delete", "flunders"))["status"] == {"allowed": False}
    assert (await local.can_i("bob", "list", "flunders"))["status"] == {"allowed": False}

    # as someone else: the impersonation is checked first, then the review runs as the target
    status, body = await local.call(
        SSAR,
        "alice",
        method="POST",
        headers={"Impersonate-User": "bob"},
        json={"spec": {"nonResourceAttributes": {}}},
    )
    assert (status, body["reason"]) == (403, "Forbidden")

    status, rules = await local.call(SSRR, "alice", method="POST", json={"spec": {"namespace": "default"}})
    assert status == 201
    assert {
        "verbs": ["get", "list"],
        "apiGroups": ["wardle.example.com"],
        "resources": ["flunders"],
    } in rules["status"]["resourceRules"]
    assert rules["status"]["incomplete"] is False


@pytest.mark.parametrize(
    ("method", "body", "code", "message"),
    [
        (
            "POST",
            {"spec": {}},
            422,
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: '
            '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
        ),
        (
            "POST",
            {
                "spec": {
                    "resourceAttributes": {"verb": "get"},
                    "nonResourceAttributes": {"path": "/x", "verb": "get"},
                }
            },
            422,
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.nonResourceAttributes: Invalid value: '
            'authorization.NonResourceAttributes{Path:"/x", Verb:"get"}: cannot be specified in combination with '
            "resourceAttributes",
        ),
        ("POST", {"kind": "Pod", "spec": {}}, 400, "not a SelfSubjectAccessReview: None, Kind=Pod"),
        ("GET", None, 405, "the server does not allow this method on the requested resource"),
    ],
)
async def test_a_bad_review_gets_kube_apiservers_status(
    local: Local, method: str, body: Any, code: int, message: str
) -> None:
    """As admin: a GET is a `list`, which RBAC refuses anyone else before the handler sees it."""
    status, answer = await local.call(SSAR, "admin", method=method, json=body)
    assert (status, answer["kind"], answer["message"]) == (code, "Status", message)


def pb_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (every field of these messages is one; lengths < 128)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def kubectl_can_i(verb: str, resource: str, namespace: str = "default") -> bytes:
    """What `kubectl auth can-i` posts: a SelfSubjectAccessReview in Kubernetes protobuf."""
    attributes = pb_field(1, namespace.encode()) + pb_field(2, verb.encode())
    attributes += pb_field(3, b"wardle.example.com") + pb_field(5, resource.encode())
    # Go writes an empty ObjectMeta's strings (1-6) empty, its generation (7) 0, creationTimestamp (8) empty.
    metadata = b"".join(pb_field(n, b"") for n in range(1, 7)) + b"\x38\x00" + pb_field(8, b"")
    review = pb_field(1, metadata) + pb_field(2, pb_field(1, attributes)) + pb_field(3, b"")
    type_meta = pb_field(1, b"authorization.k8s.io/v1") + pb_field(2, b"SelfSubjectAccessReview")
    return b"k8s\x00" + pb_field(1, type_meta) + pb_field(2, review)


async def test_kubectls_protobuf_review_is_read(local: Local) -> None:
    headers = {
        "Content-Type": "application/vnd.kubernetes.protobuf",
        "Accept": "application/vnd.kubernetes.protobuf, application/json",
    }
    for cert, allowed in (("alice", True), ("bob", False)):
        status, answer = await local.call(
            SSAR, cert, method="POST", data=kubectl_can_i("list", "flunders"), headers=headers
        )
        assert status == 201, answer
        assert answer["status"]["allowed"] is allowed
        assert answer["spec"]["resourceAttributes"] == {
            "namespace": "default",
            "verb": "list",
            "group": "wardle.example.com",
            "resource": "flunders",
        }
    status, answer = await local.call(SSAR, "alice", method="POST", data=b"k8s\x00\x0a\xff", headers=headers)
    assert (status, answer["reason"]) == (400, "BadRequest")
    status, answer = await local.call(
        SSAR, "alice", method="POST", data=b"<xml/>", headers={"Content-Type": "application/xml"}
    )
    assert (status, answer["reason"]) == (415, "UnsupportedMediaType")


async def test_always_allow_must_be_named_and_then_allows_impersonation(
    start_gateway: StartGateway, users: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.auth.build")
    server = await start_gateway(authorization_mode=["AlwaysAllow"])
    add_test_routes(server)
    (record,) = [r for r in caplog.records if "AUTHORIZATION IS OFF" in r.getMessage()]
    assert "impersonate any user, group, uid or extra" in record.getMessage()
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            server.url + FLUNDERS,
            ssl=users.client_context("bob"),
            headers={"Impersonate-User": "alice", "Impersonate-Group": "system:masters"},
        ) as resp,
    ):
        assert await resp.json() == {"name": "alice", "groups": ["system:masters", "system:authenticated"]}


@pytest.mark.parametrize(
    ("modes", "local_mode", "problem"),
    [
        ([], True, "at least one authorization-mode must be passed"),
        (
            ["Node"],
            True,
            'authorization-mode "Node" is not supported by the gateway: use AlwaysAllow, RBAC, Webhook',
        ),
        (["Everything"], True, 'authorization-mode "Everything" is not a valid mode'),
        (["RBAC", "RBAC"], True, 'authorization-mode ["RBAC" "RBAC"] has mode specified more than once'),
        (["Webhook"], True, "authorization-mode Webhook needs --kubeconfig or --authorization-kubeconfig"),
    ],
)
def test_the_mode_flag_is_checked_at_start(
    pki: PKI, apiservices_dir: Path, modes: list[str], local_mode: bool, problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        local_options(pki, str(apiservices_dir), authorization_mode=modes)
    assert refused.value.flag == "--authorization-mode"
    assert refused.value.problem.startswith(problem)


async def test_a_worker_started_after_a_bad_edit_keeps_the_last_good_rules(
    users: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    """Workers authorize with the control's compiled policy: a replacement started while the file
    is broken must not read the folder itself (it would find no rules and allow everyone)."""
    (apiservices_dir / "rbac.yaml").write_text(reader_role() + "---\n" + binding_to("alice"))
    async with running_group(users, apiservices_dir, tmp_path / "serve.log", "--workers", "2") as group:

        async def statuses(cert: str) -> list[int]:
            """The status of a list of flunders on each worker (local mode has no such group:
            404 once authorized, 403 before)."""
            answers = []
            for worker in range(2):
                connection = await on_worker(group.port, users, worker, cert=cert)
                answers.append((await connection.exchange(request_bytes("GET", FLUNDERS, []))).status)
                connection.close()
            return answers

        assert await statuses("bob") == [403, 403]
        (apiservices_dir / "rbac.yaml").write_text(
            reader_role() + "---\n" + binding_to("alice", "bob") + "- {\n"
        )
        await until(lambda: "RBAC manifest file not loaded" in group.log(), what="the broken file")
        before = {await group.worker_pid() for _ in range(20)}
        victim = await group.worker_pid()
        os.kill(victim, signal.SIGKILL)
        # Until the supervisor has reaped it, a fresh connection may land in the dead worker's
        # accept queue and be reset: ask only once its listening socket is gone.
        await until(lambda: "killed by SIGKILL" in group.log(), what="the supervisor to notice")

        async def replaced() -> bool:
            return await group.worker_pid() not in before

        await until_async(replaced, 30.0, "a new worker to answer")
        assert await statuses("bob") == [403, 403]
        assert await statuses("alice") == [404, 404]
