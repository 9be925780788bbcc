"""Credentials never reach a backend, a log line or the audit log, on every worker.

`aggregator serve` as shipped (`--workers 1` and `2`), logging everything it can (`-v 4`, every
request in the access log, every request audited at `RequestResponse`), in front of a recording
backend. A client sends bearer tokens as a WebSocket subprotocol (valid, invalid, and on a request
that is not a WebSocket upgrade at all), as `Authorization` while impersonating someone, and a
Secret in a request body. Afterwards no token, in any encoding, and no secret value appears in
anything the backend received, in the gateway's log, or in the audit log; the audit log does say
who impersonated whom (`user`, `impersonatedUser`).
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.support.backend import (
    PREFIX,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    backend_service,
    write_manifests,
)
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.rawhttp import on_worker, request_bytes
from tests.support.rbac import cluster_role, cluster_role_binding, group, may_impersonate, rule
from tests.workers.group import running_group

THINGS = f"{PREFIX}/namespaces/default/things"
EXEC_PATH = f"{THINGS}/t1/exec"
TOKEN_OPS = "ops-" + secrets.token_urlsafe(24)
TOKEN_BROWSER = "browser-" + secrets.token_urlsafe(24)
TOKEN_UNKNOWN = "unknown-" + secrets.token_urlsafe(24)


def as_protocol(token: str) -> str:
    encoded = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    return f"base64url.bearer.authorization.k8s.io.{encoded}"


def leaked_forms(value: str) -> list[str]:
    """The value and the encodings it travels in."""
    return [
        value,
        as_protocol(value).rsplit(".", 1)[1],
        base64.b64encode(value.encode()).decode().rstrip("="),
    ]


RBAC = [
    cluster_role("things", rule(["*"], ["demo.example.com"], ["things", "things/exec"])),
    cluster_role_binding("everyone-things", "things", group("system:authenticated")),
    *may_impersonate("ops", "bob"),
]
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "nonResourceURLs": ["/livez*", "/readyz*", "/healthz*", "/metrics"]},
        {"level": "RequestResponse"},
    ],
}


async def exec_websocket(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
    await ws.prepare(request)
    await ws.close()
    return ws


def websocket_upgrade(protocols: str) -> bytes:
    return request_bytes(
        "GET",
        EXEC_PATH + "?command=sh",
        [
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Protocol", protocols),
        ],
    )


@pytest.mark.parametrize("workers", [1, 2])
async def test_tokens_and_secrets_never_reach_a_backend_or_a_log(
    workers: int,
    pki: PKI,
    backend: FakeBackend,
    backend_pki: BackendPKI,
    apiservices_dir: Path,
    tmp_path: Path,
) -> None:
    backend.routes[EXEC_PATH] = exec_websocket
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        *backend_service(backend.port),
    )
    write_manifests(apiservices_dir, "rbac", *RBAC)
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(f"{TOKEN_OPS},ops,uid-ops\n{TOKEN_BROWSER},browser,uid-browser\n")
    policy = tmp_path / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_log = tmp_path / "audit.log"
    log = tmp_path / "gateway.log"
    args = [
        *("--workers", str(workers), "-v", "4", "--access-log", "all"),
        *(
            "--token-auth-file",
            str(tokens),
            "--audit-policy-file",
            str(policy),
            "--audit-log-path",
            str(audit_log),
        ),
    ]
    async with running_group(pki, apiservices_dir, log, *args) as group:

        async def on_each_worker(data: bytes, cert: str | None = None) -> list[int]:
            statuses = []
            for worker in range(workers):
                connection = await on_worker(group.port, pki, worker, cert=cert)
                statuses.append((await connection.exchange(data)).status)
                connection.close()
            return statuses

        # A browser's exec: the token authenticates, and is gone from the protocols the backend sees.
        valid = websocket_upgrade(f"v5.channel.k8s.io, {as_protocol(TOKEN_BROWSER)}")
        assert await on_each_worker(valid) == [101] * workers
        # An unknown token: 401, nothing proxied.
        assert (
            await on_each_worker(websocket_upgrade(f"v5.channel.k8s.io, {as_protocol(TOKEN_UNKNOWN)}"))
            == [401] * workers
        )
        # A token entry on a request that is no WebSocket upgrade: not a credential, never forwarded.
        plain = request_bytes("GET", THINGS, [("Sec-WebSocket-Protocol", as_protocol(TOKEN_BROWSER))])
        assert await on_each_worker(plain, cert="admin") == [200] * workers
        # A bearer token that impersonates: the backend is told bob; the audit names both.
        impersonating = request_bytes(
            "GET", THINGS, [("Authorization", f"Bearer {TOKEN_OPS}"), ("Impersonate-User", "bob")]
        )
        assert await on_each_worker(impersonating) == [200] * workers

        def events() -> list[dict[str, Any]]:
            lines = audit_log.read_text().splitlines() if audit_log.exists() else []
            return [json.loads(line) for line in lines]

        await until(lambda: len(events()) >= 3 * workers, timeout=20, what="the audit events")

    browser = [r for r in backend.received if r.all("X-Remote-User") == ["browser"]]
    assert len(browser) == workers
    assert all(r.all("Sec-WebSocket-Protocol") == ["v5.channel.k8s.io"] for r in browser)
    admin = [r for r in backend.received if r.all("X-Remote-User") == ["admin"]]
    assert len(admin) == workers and all(r.all("Sec-WebSocket-Protocol") == [] for r in admin)
    assert [r.all("X-Remote-User") for r in backend.received if "ops" in r.all("X-Remote-User")] == []

    impersonated = [e for e in events() if "impersonatedUser" in e]
    assert len(impersonated) == workers
    for event in impersonated:
        assert event["user"]["username"] == "ops"
        assert event["impersonatedUser"] == {"username": "bob", "groups": ["system:authenticated"]}

    backend_bytes = json.dumps([r.headers for r in backend.received])
    everything = {
        "backend": backend_bytes,
        "gateway log": log.read_text(),
        "audit log": audit_log.read_text(),
    }
    for value in (TOKEN_OPS, TOKEN_BROWSER, TOKEN_UNKNOWN):
        for form in leaked_forms(value):
            for where, text in everything.items():
                assert form not in text, f"{value!r} ({form!r}) leaked into the {where}"
    assert "authorization: RBAC from" in everything["gateway log"]  # the log was written at all
