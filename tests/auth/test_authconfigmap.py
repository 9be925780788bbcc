"""Kube mode without CA flags: the client CA and front-proxy settings come from the cluster's ConfigMap."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.auth.authconfigmap import ConfigMapError, parse_configmap
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import issue_client_cert, new_ca, write_pair
from tests.auth.conftest import add_test_routes
from tests.support.fakekube import CLUSTER_CAS, FakeKube, kube_options
from tests.support.fakereviews import FakeReviews
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until, until_async

UNAUTHORIZED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
    b'"reason":"Unauthorized","code":401}\n'
)


def auth_configmap(
    pki: PKI, *, client_ca: bytes | None = None, data: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """kube-apiserver's extension-apiserver-authentication, with custom front-proxy header names."""
    values: dict[str, str] = {
        "client-ca-file": (client_ca or Path(pki.path("client-ca.crt")).read_bytes()).decode(),
        "requestheader-client-ca-file": Path(pki.path("front-proxy-ca.crt")).read_text(),
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Auth-User"]),
        "requestheader-group-headers": json.dumps(["X-Auth-Groups"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Auth-Extra-"]),
    }
    values.update(data or {})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "kube-system", "name": "extension-apiserver-authentication"},
        "data": {k: v for k, v in values.items() if v is not None},
    }


Call = Callable[..., Awaitable[tuple[int, Any]]]
Start = Callable[..., Awaitable[tuple[GatewayServer, Call]]]


@pytest.fixture
async def start_kube_gateway(fake_kube: FakeKube, pki: PKI) -> AsyncIterator[Start]:
    """A kube-mode gateway with no CA flags, reading the ConfigMap from the fake (unless told)."""
    FakeReviews(fake_kube)  # allow every SubjectAccessReview
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())

        async def start(**overrides: Any) -> tuple[GatewayServer, Call]:
            settings: dict[str, Any] = {**CLUSTER_CAS, **overrides}
            assert fake_kube.kubeconfig is not None
            server = await stack.enter_async_context(
                running_gateway(kube_options(pki, fake_kube.kubeconfig, **settings))
            )
            add_test_routes(server)

            async def call(cert: str | None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
                async with session.get(
                    server.url + "/whoami", ssl=pki.client_context(cert), headers=headers or {}
                ) as resp:
                    body = await resp.read()
                    return resp.status, (json.loads(body) if resp.status == 200 else body)

            return server, call

        yield start


async def eventually_status(call: Call, cert: str, expected: int, timeout: float = 10.0) -> tuple[int, Any]:
    results: list[tuple[int, Any]] = []

    async def answered() -> bool:
        results.append(await call(cert))
        return results[-1][0] == expected

    await until_async(answered, timeout, lambda: f"{expected} for {cert} (last answer {results[-1][0]})")
    return results[-1]


async def test_client_ca_and_front_proxy_settings_come_from_the_configmap(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_object("configmaps", auth_configmap(pki))
    pki.issue_user("alice", "alice", ("devs",))
    server, call = await start_kube_gateway()
    assert "client certificates (CA from configmap kube-system/extension-apiserver-authentication)" in (
        server.gateway.auth_summary
    )
    assert await call("alice") == (200, {"name": "alice", "groups": ["devs", "system:authenticated"]})
    # the header names are the ConfigMap's, not the flags' defaults
    status, body = await call("front-proxy-client", {"X-Auth-User": "bob", "X-Auth-Groups": "g1"})
    assert (status, body) == (200, {"name": "bob", "groups": ["g1", "system:authenticated"]})
    assert await call("front-proxy-client", {"X-Remote-User": "mallory"}) == (401, UNAUTHORIZED)
    # allowed names come from the ConfigMap too
    pki.issue_user("rogue", "rogue-proxy", ca="front-proxy-ca")
    assert await call("rogue", {"X-Auth-User": "admin"}) == (401, UNAUTHORIZED)
    assert fake_kube.count("list", "configmaps") == 1
    assert fake_kube.count("watch", "configmaps") >= 1


async def test_a_ca_added_to_the_configmap_is_used_without_restart(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_object("configmaps", auth_configmap(pki))
    later = new_ca("later-client-ca")
    write_pair(pki.dir, "later-user", issue_client_cert(later, "lena"))
    _server, call = await start_kube_gateway()
    assert await call("later-user") == (401, UNAUTHORIZED)
    bundle = Path(pki.path("client-ca.crt")).read_bytes() + later.cert_pem
    fake_kube.update_object("configmaps", auth_configmap(pki, client_ca=bundle))
    assert await eventually_status(call, "later-user", 200) == (
        200,
        {"name": "lena", "groups": ["system:authenticated"]},
    )
    # and a CA removed from it stops working
    fake_kube.update_object("configmaps", auth_configmap(pki, client_ca=later.cert_pem))
    pki.issue_user("alice", "alice")
    await eventually_status(call, "alice", 401)


async def test_changes_after_a_compacted_watch_are_still_seen(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI
) -> None:
    fake_kube.add_object("configmaps", auth_configmap(pki))
    later = new_ca("later-client-ca")
    write_pair(pki.dir, "later-user", issue_client_cert(later, "lena"))
    _server, call = await start_kube_gateway()
    assert (await call("later-user"))[0] == 401
    fake_kube.expire_history()
    fake_kube.drop_watches()
    await until(
        lambda: fake_kube.count("list", "configmaps") == 2 and fake_kube.open_watches("configmaps") == 1,
        what="the ConfigMap listed again and watched",
    )
    fake_kube.update_object("configmaps", auth_configmap(pki, client_ca=later.cert_pem))
    await eventually_status(call, "later-user", 200)
    assert fake_kube.count("list", "configmaps") == 2  # 410 Gone: list it again, then watch on


async def test_a_configmap_written_long_ago_is_listed_once_and_watched(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    """On a real cluster the ConfigMap was written at install and its own resourceVersion is long
    compacted: the gateway lists it once and watches from the list's version (no 410 loop)."""
    fake_kube.add_object("configmaps", auth_configmap(pki))
    fake_kube.expire_history()
    pki.issue_user("alice", "alice")
    caplog.set_level(logging.WARNING, logger="aggregator.sources.reflector")
    _server, call = await start_kube_gateway()
    assert (await call("alice"))[0] == 200
    await until(lambda: fake_kube.open_watches("configmaps") == 1, what="the ConfigMap's watch")
    assert fake_kube.count("list", "configmaps") == 1
    assert [r.getMessage() for r in caplog.records if r.name == "aggregator.sources.reflector"] == []


async def test_configmap_created_after_start_is_picked_up(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_kube.delete_object("configmaps", "extension-apiserver-authentication", "kube-system")
    pki.issue_user("alice", "alice")
    _server, call = await start_kube_gateway()
    assert await call("alice") == (401, UNAUTHORIZED)
    fake_kube.add_object("configmaps", auth_configmap(pki))
    await eventually_status(call, "alice", 200)


async def test_an_unusable_version_keeps_the_previous_settings(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_kube.add_object("configmaps", auth_configmap(pki))
    pki.issue_user("alice", "alice")
    _server, call = await start_kube_gateway()
    assert (await call("alice"))[0] == 200
    caplog.set_level(logging.ERROR, logger="aggregator.auth.authconfigmap")
    fake_kube.update_object(
        "configmaps", auth_configmap(pki, data={"requestheader-allowed-names": "not json"})
    )
    await until(lambda: "ignoring an unusable version" in caplog.text, what="the unusable version logged")
    assert (await call("alice"))[0] == 200


async def test_skip_lookup_reads_nothing(start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI) -> None:
    fake_kube.add_object("configmaps", auth_configmap(pki))
    pki.issue_user("alice", "alice")
    _server, call = await start_kube_gateway(authentication_skip_lookup=True)
    assert await call("alice") == (401, UNAUTHORIZED)
    assert fake_kube.count("list", "configmaps") == 0


async def test_a_ca_flag_wins_over_the_configmap(
    start_kube_gateway: Start, fake_kube: FakeKube, pki: PKI
) -> None:
    other = new_ca("configmap-only-ca")
    write_pair(pki.dir, "cm-user", issue_client_cert(other, "cm"))
    fake_kube.add_object("configmaps", auth_configmap(pki, client_ca=other.cert_pem))
    pki.issue_user("alice", "alice")
    _server, call = await start_kube_gateway(client_ca_file=pki.path("client-ca.crt"))
    assert (await call("alice"))[0] == 200
    assert (await call("cm-user"))[0] == 401
    # the front-proxy half still comes from the ConfigMap
    assert (await call("front-proxy-client", {"X-Auth-User": "bob"}))[0] == 200


def test_configmap_values() -> None:
    parsed = parse_configmap(
        {"data": {"requestheader-uid-headers": '["X-Auth-Uid"]', "requestheader-allowed-names": "null"}}
    )
    assert parsed.uid_headers == ("X-Auth-Uid",)
    assert parsed.allowed_names == ()
    assert parsed.client_ca_pem is None
    with pytest.raises(ConfigMapError, match="requestheader-group-headers: not a JSON array of strings"):
        parse_configmap({"data": {"requestheader-group-headers": '"X-Auth-Groups"'}})
