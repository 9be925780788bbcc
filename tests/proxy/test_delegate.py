"""Kube mode: what the gateway does not serve goes to kube-apiserver (the fake one), as the caller."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from aggregator.backends.hops import HOP_HEADER
from aggregator.runners.server import GatewayServer
from tests.support.fakekube import GATEWAY_USER, USER, FakeKube, apiservice, kube_options
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

StartKube = Callable[..., Awaitable[GatewayServer]]


def echo(request: web.Request) -> dict[str, Any]:
    """What kube-apiserver would authenticate: the TLS/token user and the identity headers."""
    return {
        "user": request[USER],
        "path": request.raw_path,
        "remote_user": request.headers.getall("X-Remote-User", []),
        "remote_group": request.headers.getall("X-Remote-Group", []),
        "impersonate_user": request.headers.getall("Impersonate-User", []),
        "impersonate_group": request.headers.getall("Impersonate-Group", []),
        "impersonate_extra": sorted(k for k in request.headers if k.lower().startswith("impersonate-extra-")),
        "authorization": bool(request.headers.get("Authorization")),
        "forwarded_for": request.headers.get("X-Forwarded-For"),
    }


async def echo_handler(request: web.Request) -> web.StreamResponse:
    return web.json_response(echo(request))


@pytest.fixture
async def start_kube(fake_kube: FakeKube, pki: PKI, tmp_path: Path) -> AsyncIterator[StartKube]:
    """A kube-mode gateway on the fake; its front-proxy certificate is one the fake accepts."""
    cert, key = fake_kube.issue_client_cert("front-proxy-client", stem="front-proxy-for-fake")
    assert fake_kube.kubeconfig is not None
    async with AsyncExitStack() as stack:

        async def start(**overrides: Any) -> GatewayServer:
            settings: dict[str, Any] = {
                "proxy_client_cert_file": str(cert),
                "proxy_client_key_file": str(key),
            }
            settings.update(overrides)
            assert fake_kube.kubeconfig is not None
            options = kube_options(pki, fake_kube.kubeconfig, **settings)
            return await stack.enter_async_context(running_gateway(options))

        yield start


async def get(server: GatewayServer, pki: PKI, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            URL(server.url + path, encoded=True), ssl=pki.client_context(), allow_redirects=False, **kwargs
        ) as resp,
    ):
        body = await resp.read()
        return resp.status, (
            json.loads(body) if body and resp.content_type == "application/json" else resp.headers
        )


async def test_front_proxy_delegate_presents_the_certificate_and_the_callers_identity(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_route("GET", "/version", echo_handler)
    server = await start_kube()
    status, doc = await get(
        server, pki, "/version", headers={"X-Remote-User": "evil", "Authorization": "Bearer x"}
    )
    assert status == 200
    assert doc["user"] == "front-proxy-client"  # not the gateway's kubeconfig token
    assert doc["authorization"] is False
    assert doc["remote_user"] == ["admin"]
    assert doc["remote_group"] == ["system:masters", "system:authenticated"]
    assert doc["forwarded_for"] == "127.0.0.1"


async def test_front_proxy_delegate_lets_kube_apiserver_judge_impersonation(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_route("GET", "/api/v1/namespaces/default/pods", echo_handler)
    server = await start_kube()
    status, doc = await get(
        server,
        pki,
        "/api/v1/namespaces/default/pods",
        headers={"Impersonate-User": "jane", "Impersonate-Group": "devs"},
    )
    assert status == 200
    assert doc["remote_user"] == ["admin"]
    assert doc["impersonate_user"] == ["jane"]
    assert doc["impersonate_group"] == ["devs"]


async def test_impersonating_delegate_uses_the_gateway_credentials(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_route("GET", "/version", echo_handler)
    server = await start_kube(delegate_auth="impersonate")
    status, doc = await get(server, pki, "/version", headers={"X-Remote-User": "evil"})
    assert status == 200
    assert doc["user"] == GATEWAY_USER
    assert doc["authorization"] is True
    assert doc["remote_user"] == []
    assert doc["impersonate_user"] == ["admin"]
    # kube-apiserver adds system:authenticated itself.
    assert doc["impersonate_group"] == ["system:masters"]
    assert doc["impersonate_extra"] == ["Impersonate-Extra-Authentication.kubernetes.io%2fcredential-Id"]


async def test_impersonating_delegate_refuses_nested_impersonation(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_route("GET", "/version", echo_handler)
    server = await start_kube(delegate_auth="impersonate")
    status, doc = await get(server, pki, "/version", headers={"Impersonate-User": "jane"})
    assert status == 403
    assert "cannot be nested" in doc["message"]
    assert [r.path for r in fake_kube.requests if r.path == "/version"] == []


async def test_built_in_resources_local_apiservices_and_unknown_paths_are_delegated(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_object(
        "configmaps", {"metadata": {"namespace": "default", "name": "cm1"}, "data": {"a": "b"}}
    )
    fake_kube.add_object("apiservices", apiservice("wardle.example.com", "v1", service=None))
    fake_kube.add_route("GET", "/apis/wardle.example.com/v1/flunders", echo_handler)
    fake_kube.add_route("GET", "/nothing/here", echo_handler)
    server = await start_kube()
    await until(
        lambda: server.gateway.store.apiservice("v1.wardle.example.com") is not None, what="the APIService"
    )

    status, doc = await get(server, pki, "/api/v1/namespaces/default/configmaps?limit=5")
    assert status == 200
    assert [item["metadata"]["name"] for item in doc["items"]] == ["cm1"]
    status, doc = await get(server, pki, "/apis/wardle.example.com/v1/flunders")
    assert (status, doc["remote_user"]) == (200, ["admin"])
    status, doc = await get(server, pki, "/nothing/here?x=%2F")
    assert (status, doc["path"]) == (200, "/nothing/here?x=%2F")


async def test_kube_apiserver_redirects_are_passed_on(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    async def moved(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=301, headers={"Location": "/api/v1/namespaces/default/services/s/proxy/"})

    fake_kube.add_route("GET", "/api/v1/namespaces/default/services/s/proxy", moved)
    server = await start_kube()
    status, headers = await get(server, pki, "/api/v1/namespaces/default/services/s/proxy")
    assert status == 301
    assert headers["Location"] == "/api/v1/namespaces/default/services/s/proxy/"


async def test_exec_on_a_pod_tunnels_through_the_delegate(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    seen: list[dict[str, Any]] = []

    async def exec_ws(request: web.Request) -> web.StreamResponse:
        seen.append(echo(request))
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"\x01" + msg.data[1:])
        return ws

    path = "/api/v1/namespaces/default/pods/p1/exec"
    fake_kube.add_route("GET", path, exec_ws)
    server = await start_kube()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            server.url + path + "?command=ls",
            protocols=("v5.channel.k8s.io",),
            ssl=pki.client_context(),
            headers={"X-Remote-Group": "system:masters-spoof"},
        ) as ws,
    ):
        await ws.send_bytes(b"\x00hello")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == b"\x01hello"
    (doc,) = seen
    assert doc["user"] == "front-proxy-client"
    assert doc["remote_user"] == ["admin"]
    assert doc["remote_group"] == ["system:masters", "system:authenticated"]


async def test_unreachable_kube_apiserver_is_503(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    server = await start_kube()
    await fake_kube.stop()
    status, doc = await get(server, pki, "/version")
    assert status == 503
    assert (
        doc["message"]
        == f"error trying to reach service: dial tcp 127.0.0.1:{fake_kube.port}: connect: connection refused"
    )


@pytest.mark.parametrize("delegate_auth", ["front-proxy", "impersonate"])
async def test_the_impersonation_gate_leaves_kube_apiservers_paths_to_it(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI, delegate_auth: str
) -> None:
    """kube-apiserver applies (front-proxy) or the delegate refuses (impersonate) what the caller
    sent: the gate neither judges it (a group without a user would be its 500) nor rewrites it."""
    fake_kube.add_route("GET", "/api/v1/namespaces/default/pods", echo_handler)
    server = await start_kube(delegate_auth=delegate_auth)
    status, doc = await get(
        server, pki, "/api/v1/namespaces/default/pods", headers={"Impersonate-Group": "devs"}
    )
    if delegate_auth == "front-proxy":
        assert status == 200
        assert (doc["remote_user"], doc["impersonate_group"]) == (["admin"], ["devs"])
    else:
        assert status == 403
        assert "cannot be nested" in doc["message"]


async def test_delegated_requests_carry_the_loop_mark(
    start_kube: StartKube, fake_kube: FakeKube, pki: PKI
) -> None:
    """A loop through kube-apiserver's own aggregator (an APIService there served by the gateway)
    comes back with the mark, which kube-apiserver's proxy passes on, and is refused there."""
    marks: list[list[str]] = []

    async def record(request: web.Request) -> web.StreamResponse:
        marks.append(request.headers.getall(HOP_HEADER, []))
        return web.json_response(echo(request))

    fake_kube.add_route("GET", "/version", record)
    server = await start_kube()
    status, _ = await get(server, pki, "/version", headers={HOP_HEADER: "another-gateway"})
    assert status == 508  # already forwarded once: refused before anything is delegated
    assert marks == []
    status, _ = await get(server, pki, "/version")
    assert status == 200
    assert marks == [[server.gateway.hop]]
