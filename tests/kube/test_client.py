"""KubeClient against the fake kube-apiserver: credentials of every kind reach it, rotations are picked up."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.kube import calls
from aggregator.kube.calls import ApiCall
from aggregator.kube.client import (
    InClusterCredentials,
    KubeAPIError,
    KubeClient,
    KubeUnreachable,
    NotLoaded,
)
from aggregator.sources.options import SourceConfig
from aggregator.tls.issue import load_pair
from aggregator.tls.pem import load_pair_into, read_pair
from aggregator.util.flags import ConfigError
from tests.support.fakekube import GATEWAY_USER, FakeKube, apiservice
from tests.support.ports import free_port


@pytest.fixture
async def clients() -> AsyncIterator[list[KubeClient]]:
    """Clients created by a test, closed after it."""
    made: list[KubeClient] = []
    yield made
    for client in made:
        await client.stop()


def kubeconfig_client(clients: list[KubeClient], path: Path, **kwargs: Any) -> KubeClient:
    client = KubeClient.from_kubeconfig(str(path), **kwargs)
    clients.append(client)
    return client


# --- declared calls ------------------------------------------------------------------------------


def test_declared_calls_map_to_kube_paths() -> None:
    assert calls.LIST_APISERVICES.url_path() == "/apis/apiregistration.k8s.io/v1/apiservices"
    assert calls.WATCH_SERVICES.url_path() == "/api/v1/services"
    assert calls.WATCH_SERVICES.url_path(namespace="kube-system") == "/api/v1/namespaces/kube-system/services"
    assert calls.LIST_ENDPOINTSLICES.url_path() == "/apis/discovery.k8s.io/v1/endpointslices"
    status = ApiCall("update", "apiregistration.k8s.io", "v1", "apiservices", subresource="status")
    assert status.url_path(name="v1.x.io") == "/apis/apiregistration.k8s.io/v1/apiservices/v1.x.io/status"
    assert status.rbac_resource == "apiservices/status" and status.method == "PUT"
    assert ApiCall("get", path="/apis").url_path() == "/apis"
    with pytest.raises(ValueError, match="cluster-scoped"):
        calls.LIST_APISERVICES.url_path(namespace="default")
    with pytest.raises(ValueError, match="needs an object name"):
        status.url_path()
    with pytest.raises(ValueError, match="unknown verb"):
        ApiCall("frobnicate", resource="pods")


def test_every_object_source_call_is_declared() -> None:
    declared = calls.declared_calls()
    for call in (
        calls.LIST_APISERVICES,
        calls.WATCH_APISERVICES,
        calls.LIST_SERVICES,
        calls.WATCH_SERVICES,
        calls.LIST_ENDPOINTSLICES,
        calls.WATCH_ENDPOINTSLICES,
    ):
        assert call in declared
    assert all(isinstance(c, ApiCall) for c in declared)


async def test_undeclared_call_is_refused_before_any_request(
    fake_kube: FakeKube, clients: list[KubeClient]
) -> None:
    assert fake_kube.kubeconfig is not None
    client = kubeconfig_client(clients, fake_kube.kubeconfig)
    with pytest.raises(ValueError, match=r"undeclared kube-apiserver call list secrets\.core"):
        await client.request(ApiCall("list", "", "v1", "secrets", namespaced=True))
    assert fake_kube.requests == []


# --- credentials ---------------------------------------------------------------------------------


async def test_token_from_kubeconfig_reaches_the_server(
    fake_kube: FakeKube, clients: list[KubeClient]
) -> None:
    fake_kube.add_object("apiservices", apiservice())
    assert fake_kube.kubeconfig is not None
    client = kubeconfig_client(clients, fake_kube.kubeconfig)
    doc = await client.request_json(calls.LIST_APISERVICES)
    assert [i["metadata"]["name"] for i in doc["items"]] == ["v1alpha1.wardle.example.com"]
    assert fake_kube.users() == [GATEWAY_USER]
    assert client.base_url == fake_kube.url
    assert (await client.auth_headers()) == {"Authorization": "Bearer gateway-token"}


async def test_client_certificate_from_kubeconfig_reaches_the_server(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    pair = fake_kube.issue_client_cert("system:kube-aggregator", ("system:masters",))
    for embed in (True, False):
        path = fake_kube.write_kubeconfig(
            tmp_path / f"cert-{embed}.kubeconfig", client_cert=pair, embed=embed
        )
        client = kubeconfig_client(clients, path)
        assert await client.auth_headers() == {}
        response = await client.request(calls.LIST_SERVICES)
        assert response.status == 200
    assert fake_kube.users() == ["system:kube-aggregator", "system:kube-aggregator"]


async def test_no_credentials_get_401_as_a_kube_api_error(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    client = kubeconfig_client(clients, fake_kube.write_kubeconfig(tmp_path / "anon.kubeconfig"))
    with pytest.raises(KubeAPIError) as caught:
        await client.request_json(calls.LIST_APISERVICES)
    assert caught.value.status == 401 and caught.value.reason == "Unauthorized"
    assert fake_kube.unauthorized == 1 and fake_kube.requests == []


async def test_rotated_token_file_is_picked_up_on_refresh(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-a\n")  # trailing newline as written by most tools
    fake_kube.add_token("token-a", "alice")
    path = fake_kube.write_kubeconfig(tmp_path / "tf.kubeconfig", token_file=token_file)
    client = kubeconfig_client(clients, path, refresh_interval=0.2)
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    token_file.write_text("token-b\n")
    del fake_kube.tokens["token-a"]
    fake_kube.add_token("token-b", "bob")
    await asyncio.sleep(0.3)  # past the refresh interval: the next request re-reads the credentials
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    assert fake_kube.users() == ["alice", "bob"]


async def test_edited_kubeconfig_is_reloaded_after_a_401(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    """With a long refresh interval, a 401 alone makes the next request reload the credentials."""
    path = fake_kube.write_kubeconfig(tmp_path / "edit.kubeconfig", token="old")
    fake_kube.add_token("old", "alice")
    client = kubeconfig_client(clients, path, refresh_interval=3600)
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    fake_kube.write_kubeconfig(path, token="new")
    del fake_kube.tokens["old"]
    fake_kube.add_token("new", "bob")
    assert (await client.request(calls.LIST_APISERVICES)).status == 401
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    assert fake_kube.users() == ["alice", "bob"]


EXEC_PLUGIN = """
import json, sys, datetime
token = open(sys.argv[1]).read().strip()
expiry = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": expiry}}))
"""


async def test_exec_plugin_token_is_used_and_rerun_when_expired(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    plugin, token_file = tmp_path / "plugin.py", tmp_path / "exec-token"
    plugin.write_text(EXEC_PLUGIN)
    token_file.write_text("exec-a")
    fake_kube.add_token("exec-a", "exec-alice")
    fake_kube.add_token("exec-b", "exec-bob")
    path = fake_kube.write_kubeconfig(tmp_path / "exec.kubeconfig")
    config = json.loads(json.dumps(__import__("yaml").safe_load(path.read_text())))
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin), str(token_file)],
            "interactiveMode": "Never",
        }
    }
    path.write_text(json.dumps(config))
    client = kubeconfig_client(clients, path, refresh_interval=0.1)
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    token_file.write_text("exec-b")
    await asyncio.sleep(0.2)  # past the refresh interval: the next request re-reads the credentials
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    assert fake_kube.users() == ["exec-alice", "exec-bob"]


async def test_in_cluster_token_file_is_reread(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    token_file = tmp_path / "sa-token"
    token_file.write_text("sa-1")
    fake_kube.add_token("sa-1", "system:serviceaccount:aggregator:gateway")
    credentials = InClusterCredentials(
        token_file=str(token_file),
        ca_file=str(fake_kube.ca_file),
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake_kube.port)},
    )
    client = KubeClient(credentials, refresh_interval=0.1)
    clients.append(client)
    assert (await client.request(calls.LIST_SERVICES)).status == 200
    token_file.write_text("sa-2")
    fake_kube.tokens = {"sa-2": "rotated"}
    await asyncio.sleep(0.2)  # past the refresh interval: the next request re-reads the credentials
    assert (await client.request(calls.LIST_SERVICES)).status == 200
    assert fake_kube.users() == ["system:serviceaccount:aggregator:gateway", "rotated"]
    assert client.base_url == fake_kube.url


# --- TLS -----------------------------------------------------------------------------------------


async def test_tls_server_name_verifies_a_certificate_for_another_name(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    # The fake's certificate names 127.0.0.1 and kubernetes.default.svc, not localhost.
    server = f"https://localhost:{fake_kube.port}"
    plain = fake_kube.write_kubeconfig(tmp_path / "plain.kubeconfig", token="gateway-token", server=server)
    client = kubeconfig_client(clients, plain)
    with pytest.raises(KubeUnreachable, match="TLS verification failed"):
        await client.request(calls.LIST_APISERVICES)
    named = fake_kube.write_kubeconfig(
        tmp_path / "named.kubeconfig",
        token="gateway-token",
        server=server,
        tls_server_name="kubernetes.default.svc",
    )
    client = kubeconfig_client(clients, named)
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    assert client.trust.server_name == "kubernetes.default.svc"


async def test_server_trust_is_reusable_with_another_client_certificate(
    fake_kube: FakeKube, clients: list[KubeClient]
) -> None:
    """What the delegate does in front-proxy mode: trust from the client, its own certificate."""
    assert fake_kube.kubeconfig is not None
    client = kubeconfig_client(clients, fake_kube.kubeconfig)
    with pytest.raises(NotLoaded):
        _ = client.trust
    await client.load()
    cert, key = fake_kube.issue_client_cert("front-proxy-client")
    ctx = client.trust.new_context()
    load_pair_into(ctx, read_pair(str(cert), str(key)))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{client.base_url}/api/v1/services", **client.trust.connect_kwargs(ctx)) as response,
    ):
        assert response.status == 200
    bare = client.trust.new_context()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{client.base_url}/api/v1/services", **client.trust.connect_kwargs(bare)) as response,
    ):
        assert response.status == 401
    assert fake_kube.users() == ["front-proxy-client"]


async def test_rotated_client_certificate_file_gets_a_new_tls_context(
    fake_kube: FakeKube, clients: list[KubeClient], tmp_path: Path
) -> None:
    cert, key = fake_kube.issue_client_cert("first", stem="rotating")
    path = fake_kube.write_kubeconfig(tmp_path / "files.kubeconfig", client_cert=(cert, key), embed=False)
    client = kubeconfig_client(clients, path, refresh_interval=0.1)
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    first_context = client.ssl_context
    fake_kube.issue_client_cert("second", stem="rotating")
    assert load_pair(tmp_path / "fake-kube", "rotating").cert.subject.rfc4514_string() == "CN=second"
    await asyncio.sleep(0.2)  # past the refresh interval: the next request re-reads the credentials
    assert (await client.request(calls.LIST_APISERVICES)).status == 200
    assert client.ssl_context is not first_context
    assert fake_kube.users() == ["first", "second"]


async def test_refused_connection_is_kube_unreachable_naming_the_address(
    clients: list[KubeClient], tmp_path: Path
) -> None:
    port = free_port()
    fake = FakeKube(tmp_path / "down", port=port)  # never started
    client = kubeconfig_client(clients, fake.write_kubeconfig(tmp_path / "down.kubeconfig", token="t"))
    with pytest.raises(KubeUnreachable, match=f"cannot connect to 127.0.0.1:{port}"):
        await client.request_json(calls.LIST_APISERVICES)


def test_the_source_configuration_picks_the_client(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text("{}")
    local_without = SourceConfig(apiservices_dir=str(tmp_path))
    assert local_without.kube_client() is None
    local_with = SourceConfig(apiservices_dir=str(tmp_path), kubeconfig=str(kubeconfig))
    client = local_with.kube_client()
    assert client is not None and client.credentials.description == f"kubeconfig {kubeconfig}"
    in_cluster = SourceConfig().kube_client()
    assert in_cluster is not None and in_cluster.credentials.description == "in-cluster service account"


def test_expiry_helper_sanity() -> None:
    # The exec plugin above reports "now" as expiry; the loader treats that as expired (skew), so
    # each refresh re-runs it. Guard the assumption the exec test relies on.
    from kubernetes.aio.config.kube_config import _is_expired

    is_expired: Callable[[str], bool] = _is_expired  # the client library is untyped
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert is_expired(now)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("not: [a, kubeconfig", "cannot load kubeconfig"),
        ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n", "cannot load kubeconfig"),
    ],
)
async def test_unloadable_kubeconfig_is_a_config_error_naming_the_file(
    clients: list[KubeClient], tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "broken.kubeconfig"
    path.write_text(content)
    client = kubeconfig_client(clients, path)
    with pytest.raises(ConfigError) as caught:
        await client.start()
    assert caught.value.flag == "--kubeconfig"
    assert f"{reason} {path}" in str(caught.value)


async def test_missing_in_cluster_files_are_a_config_error(clients: list[KubeClient], tmp_path: Path) -> None:
    client = KubeClient(
        InClusterCredentials(
            token_file=str(tmp_path / "missing-token"),
            ca_file=str(tmp_path / "missing-ca"),
            environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        )
    )
    clients.append(client)
    with pytest.raises(
        ConfigError, match="in-cluster: cannot load in-cluster service account: Service token file"
    ):
        await client.load()
