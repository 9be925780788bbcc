"""Path confusion: a path a backend could clean into another resource than the one authorized is
refused with a 400 Status before routing, authentication or any backend sees it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from aggregator.runners.server import GatewayServer
from aggregator.web.paths import path_problem
from tests.support.backend import PREFIX
from tests.support.fakekube import FakeKube, kube_options
from tests.support.fixtures import StartProxied
from tests.support.gateway import running_gateway
from tests.support.pki import PKI

OTHER = "/apis/other.example.com/v1/namespaces/default/secrets"

REFUSED = [
    f"{PREFIX}/../../other.example.com/v1/namespaces/default/secrets",
    f"{PREFIX}/%2e%2e/%2e%2e/other.example.com/v1/secrets",
    f"{PREFIX}/%2E%2E/%2e%2E/other.example.com/v1/secrets",
    f"{PREFIX}/.%2e/.%2E/other.example.com/v1/secrets",
    f"{PREFIX}/%2e./x",
    f"{PREFIX}/./namespaces/default/things",
    f"{PREFIX}/%2e/namespaces/default/things",
    f"{PREFIX}/namespaces/default/things/..",
    f"{PREFIX}/namespaces/default/things/.",
    f"{PREFIX}/namespaces/default/things/%2E",
    f"{PREFIX}/namespaces/default/things/..?watch=true",
    f"{PREFIX}/namespaces/x%2F..%2F..%2Fkube-system/things",
    f"{PREFIX}/namespaces/x%2f..%2f..%2fkube-system/things",
    f"{PREFIX}/..;/..;/other.example.com/v1/secrets",
    f"{PREFIX}/..\\..\\other.example.com",
    f"{PREFIX}/%5C..%5C..%5Cother.example.com",
    f"{PREFIX}/namespaces//things",
    f"{PREFIX}//namespaces/default/things",
    f"{PREFIX}/namespaces/%2F/things",
    "//apis",
    "/api/v1/namespaces/../pods",
    "/api/v1/namespaces/%2e%2e/secrets",
    "/healthz/../metrics",
]

ALLOWED = [
    "/",
    "/apis",
    "/apis/",
    f"{PREFIX}/",
    f"{PREFIX}/namespaces/default/things/a.b",
    f"{PREFIX}/namespaces/default/things/...",
    f"{PREFIX}/namespaces/default/things/.hidden",
    f"{PREFIX}/namespaces/default/things/x..y",
    f"{PREFIX}/namespaces/default/things?fieldSelector=metadata.name%3D..&labelSelector=a//b",
    f"{PREFIX}/namespaces/default/things/%41",
    "/openapi/v3/apis/demo.example.com/v1?hash=ABC",
]


@pytest.mark.parametrize("path", REFUSED)
def test_dot_and_empty_segments_are_found_raw_or_encoded(path: str) -> None:
    assert path_problem(path) is not None


@pytest.mark.parametrize("path", ALLOWED)
def test_ordinary_paths_pass(path: str) -> None:
    assert path_problem(path) is None


def test_absolute_form_targets_are_checked_too() -> None:
    assert path_problem("https://gateway:8443/apis/a/v1/../../b/v1") == 'it contains a ".." segment'
    assert path_problem("https://gateway:8443/apis/a/v1/things") is None


async def raw_request(
    server: GatewayServer, pki: PKI, target: str, cert: str | None = "admin"
) -> tuple[int, Any]:
    """Send `target` exactly as given (client libraries clean dot segments themselves)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=pki.client_context(cert))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(-1), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body) if body.startswith(b"{") else body


@pytest.mark.parametrize("path", REFUSED)
async def test_confusing_paths_never_reach_a_backend(start_proxied: StartProxied, path: str) -> None:
    proxied = await start_proxied()
    status, body = await raw_request(proxied.server, proxied.pki, path)
    assert status == 400
    assert body["kind"] == "Status" and body["reason"] == "BadRequest"
    assert body["message"].startswith(f'invalid request path "{path}": it contains ')
    # Not even an unauthenticated caller gets further (and no review is spent).
    assert (await raw_request(proxied.server, proxied.pki, path, cert=None))[0] == 400
    assert proxied.backend.seen_by("admin") == []  # (the gateway's own fetches come as itself)


async def test_ordinary_paths_still_reach_the_backend(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    path = f"{PREFIX}/namespaces/default/things/x..y"
    status, body = await raw_request(proxied.server, proxied.pki, path)
    assert status == 200 and body["path"] == path


async def test_paths_to_kube_apiserver_are_refused_alike(pki: PKI, fake_kube: FakeKube) -> None:
    """kube-apiserver itself accepts `..` as a namespace (k/k#119269); the gateway refuses it."""
    assert fake_kube.kubeconfig is not None
    async with running_gateway(kube_options(pki, fake_kube.kubeconfig)) as server:
        seen = len(fake_kube.requests)
        for path in ("/api/v1/namespaces/../pods", "/api/v1/namespaces/%2E%2E/secrets", "/api//v1/pods"):
            status, body = await raw_request(server, pki, path)
            assert status == 400, path
            assert body["reason"] == "BadRequest"
        delegated = [r for r in fake_kube.requests[seen:] if r.path.startswith("/api/v1/namespaces")]
        assert delegated == []
