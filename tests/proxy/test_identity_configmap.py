"""S4 in kube mode: front-proxy header names from the cluster's ConfigMap are stripped too, live.

kube-apiserver publishes its front-proxy header names in `kube-system/extension-apiserver-
authentication`; extension servers (and kube-apiserver itself, behind the delegate) trust those
names from a certificate like the gateway's. A caller who could slip `X-Auth-Groups:
system:masters` past the gateway would be a cluster admin there (k/k#119631), so whatever names
the ConfigMap holds right now never cross the gateway: only the identity the gateway asserts does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from aggregator.runners.server import GatewayServer
from tests.support.backend import (
    APISERVICE,
    GROUP,
    NAMESPACE,
    PREFIX,
    SERVER_NAME,
    SERVICE,
    VERSION,
    BackendPKI,
    FakeBackend,
    Received,
    endpointslice_manifest,
    service_manifest,
    wait_available,
)
from tests.support.fakekube import CLUSTER_CAS, USER, FakeKube, kube_options
from tests.support.fakereviews import FakeReviews
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until_async

THINGS = f"{PREFIX}/namespaces/default/things"
EXEC = f"{PREFIX}/namespaces/default/pods/p1/exec"
ALICE_TOKEN = "alice-token"
# The identity alice is, as the gateway asserts it (TokenReview's user plus system:authenticated).
ALICE = ("alice", ["devs", "system:authenticated"])


def auth_configmap(pki: PKI, *, user: str, groups: str, extra: str) -> dict[str, Any]:
    """kube-apiserver's extension-apiserver-authentication with custom front-proxy header names."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "kube-system", "name": "extension-apiserver-authentication"},
        "data": {
            "client-ca-file": Path(pki.path("client-ca.crt")).read_text(),
            "requestheader-client-ca-file": Path(pki.path("front-proxy-ca.crt")).read_text(),
            "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
            "requestheader-username-headers": json.dumps([user]),
            "requestheader-group-headers": json.dumps([groups]),
            "requestheader-extra-headers-prefix": json.dumps([extra]),
        },
    }


def spoofed(
    user: str = "X-Auth-User", groups: str = "X-Auth-Groups", extra: str = "X-Auth-Extra-"
) -> CIMultiDict[str]:
    """What a caller sends to pass as an admin: the configured names in odd cases, repeated."""
    return CIMultiDict(
        [
            (user.lower(), "admin"),
            (groups, "system:masters"),
            (groups.upper(), "system:masters"),
            (f"{extra}Scopes", "*"),
            ("X-Remote-User", "admin"),
            ("Authorization", f"Bearer {ALICE_TOKEN}"),
        ]
    )


def assert_only_gateway_identity(seen: Received, *, custom: tuple[str, ...]) -> None:
    """Exactly alice as the gateway asserts her; none of the caller's identity headers."""
    assert seen.all("X-Remote-User") == [ALICE[0]]
    assert seen.all("X-Remote-Group") == ALICE[1]
    assert seen.all("Authorization") == []
    lowered = [name.lower() for name, _ in seen.headers]
    leaked = [name for name in lowered if name.startswith(custom)]
    assert leaked == [], f"spoofed identity headers reached the backend: {leaked}"
    assert [n for n in lowered if n.startswith("x-remote-extra-")] == []  # token users have no extra


@dataclass
class Cluster:
    fake: FakeKube
    backend: FakeBackend
    server: GatewayServer
    pki: PKI
    session: aiohttp.ClientSession

    def get(self, path: str, headers: CIMultiDict[str]) -> Any:
        """As alice: her bearer token, no client certificate."""
        return self.session.get(self.server.url + path, headers=headers, ssl=self.pki.client_context(None))


@pytest.fixture
async def cluster(fake_kube: FakeKube, pki: PKI, backend_pki: BackendPKI) -> AsyncIterator[Cluster]:
    """A kube-mode gateway without CA flags (the ConfigMap decides), one APIService on a TLS backend.

    The gateway presents one front-proxy certificate to both the extension server and the fake
    kube-apiserver (the delegate), so both trust the fake's client CA for it.
    """
    reviews = FakeReviews(fake_kube)
    reviews.add_user(ALICE_TOKEN, ALICE[0], groups=("devs",))
    fake_kube.add_object(
        "configmaps", auth_configmap(pki, user="X-Auth-User", groups="X-Auth-Groups", extra="X-Auth-Extra-")
    )
    proxy_cert, proxy_key = fake_kube.issue_client_cert("front-proxy-client", stem="front-proxy-both")
    cert, key = backend_pki.serving("identity-configmap", [SERVER_NAME])
    backend = FakeBackend(cert, key, str(fake_kube.dir / "client-ca.crt"))
    port = await backend.start()
    fake_kube.add_object(
        "apiservices",
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
                "caBundle": base64.b64encode(backend_pki.ca.cert_pem).decode(),
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
            },
        },
    )
    fake_kube.add_object("services", service_manifest(port=port))
    fake_kube.add_object("endpointslices", endpointslice_manifest("api-1", [("127.0.0.1", True)], port=port))
    assert fake_kube.kubeconfig is not None
    options = kube_options(
        pki,
        fake_kube.kubeconfig,
        **CLUSTER_CAS,
        proxy_client_cert_file=str(proxy_cert),
        proxy_client_key_file=str(proxy_key),
    )
    try:
        async with running_gateway(options) as server, aiohttp.ClientSession() as session:
            await wait_available(server)
            yield Cluster(fake_kube, backend, server, pki, session)
    finally:
        await backend.stop()


async def test_configmap_header_names_never_reach_the_backend(cluster: Cluster) -> None:
    async with cluster.get(THINGS, spoofed()) as resp:
        assert resp.status == 200
        assert await resp.json() == {"path": THINGS, "user": ALICE[0], "groups": ALICE[1]}
    (seen,) = cluster.backend.seen_by(ALICE[0])
    assert_only_gateway_identity(seen, custom=("x-auth-",))


async def test_configmap_header_names_never_reach_the_backend_on_an_upgrade(cluster: Cluster) -> None:
    async def exec_ws(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"\x01" + msg.data[1:])
        return ws

    cluster.backend.routes[EXEC] = exec_ws
    async with cluster.session.ws_connect(
        cluster.server.url + EXEC + "?command=id",
        protocols=("v5.channel.k8s.io",),
        ssl=cluster.pki.client_context(None),
        headers=spoofed(),
    ) as ws:
        await ws.send_bytes(b"\x00id")
        assert (await asyncio.wait_for(ws.receive(), 5)).data == b"\x01id"
    (seen,) = [r for r in cluster.backend.seen_by(ALICE[0]) if r.raw_path.startswith(EXEC)]
    assert seen.one("Upgrade") == "websocket"
    assert_only_gateway_identity(seen, custom=("x-auth-",))


async def test_configmap_header_names_never_reach_kube_apiserver(cluster: Cluster) -> None:
    """The delegate: kube-apiserver trusts exactly these names from the gateway's certificate."""
    seen: list[tuple[str | None, list[tuple[str, str]]]] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        seen.append((request[USER], [(k, v) for k, v in request.headers.items()]))
        return web.json_response({"kind": "PodList", "items": []})

    path = "/api/v1/namespaces/default/pods"
    cluster.fake.add_route("GET", path, pods)
    async with cluster.get(path, spoofed()) as resp:
        assert resp.status == 200
    ((client, headers),) = seen
    assert client == "front-proxy-client"
    received = Received("GET", path, headers, client)
    assert_only_gateway_identity(received, custom=("x-auth-",))


async def test_names_changed_in_the_configmap_are_stripped_from_then_on(cluster: Cluster) -> None:
    cluster.fake.update_object(
        "configmaps",
        auth_configmap(cluster.pki, user="X-Proxy-User", groups="X-Proxy-Group", extra="X-Proxy-Extra-"),
    )

    # The authenticator reads the new version: a front proxy asserting X-Proxy-User is believed.
    async def new_names_in_force() -> bool:
        async with cluster.session.get(
            cluster.server.url + THINGS,
            headers={"X-Proxy-User": "carol"},
            ssl=cluster.pki.client_context("front-proxy-client"),
        ) as resp:
            return resp.status == 200 and (await resp.json())["user"] == "carol"

    await until_async(new_names_in_force, what="the new ConfigMap applied")

    async with cluster.get(THINGS, spoofed("X-Proxy-User", "X-Proxy-Group", "X-Proxy-Extra-")) as resp:
        assert resp.status == 200
    (seen,) = cluster.backend.seen_by(ALICE[0])
    assert_only_gateway_identity(seen, custom=("x-proxy-",))
