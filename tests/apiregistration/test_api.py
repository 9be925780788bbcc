"""Local mode serves apiregistration.k8s.io/v1 itself, read-only: as kube-apiserver, for kubectl."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.model.apiservice import APIService, Condition
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import load_pair
from tests.conftest import StartGateway
from tests.discovery.manifests import apiservice, write_manifests
from tests.support.e2e import Kubectl, kubectl_binaries
from tests.support.pki import PKI
from tests.support.polling import until

RESOURCE_LIST = (
    b'{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"apiregistration.k8s.io/v1","resources":['
    b'{"name":"apiservices","singularName":"apiservice","namespaced":false,"kind":"APIService","verbs":'
    b'["get","list","watch"],"categories":["api-extensions"],'
    b'"storageVersionHash":"InPBPD7+PqM="},{"name":"apiservices/status","singularName":"","namespaced":false,'
    b'"kind":"APIService","verbs":["get"]}]}\n'
)
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
BASE = "/apis/apiregistration.k8s.io/v1"


async def conditions_recorded(server: GatewayServer, *names: str) -> None:
    """Wait for the availability checker's first verdicts, so later writes cannot race the test."""
    store = server.gateway.store
    await until(
        lambda: all((svc := store.apiservice(n)) is not None and svc.conditions for n in names),
        what=f"an Available condition recorded for {names}",
    )


async def test_group_resources_list_get_and_errors(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(
        apiservices_dir,
        [
            apiservice("v1beta1.metrics.k8s.io", 100, 100, service=("kube-system", "metrics-server")),
            apiservice("v1.apps", 17800, 15, service=None),
        ],
    )
    server = await start_gateway()
    await conditions_recorded(server, "v1.apps", "v1beta1.metrics.k8s.io")
    ssl = pki.client_context()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + BASE, ssl=ssl) as resp:
            assert resp.status == 200 and await resp.read() == RESOURCE_LIST
        async with session.get(server.url + "/apis/apiregistration.k8s.io", ssl=ssl) as resp:
            assert (await resp.json())["preferredVersion"] == {
                "groupVersion": "apiregistration.k8s.io/v1",
                "version": "v1",
            }

        async with session.get(server.url + BASE + "/apiservices", ssl=ssl) as resp:
            assert resp.status == 200
            listed = await resp.json()
        assert listed["kind"] == "APIServiceList" and listed["metadata"]["resourceVersion"] == str(
            server.gateway.store.revision
        )
        assert [i["metadata"]["name"] for i in listed["items"]] == ["v1.apps", "v1beta1.metrics.k8s.io"]
        metrics = listed["items"][1]
        assert list(metrics) == ["kind", "apiVersion", "metadata", "spec", "status"]
        assert list(metrics["metadata"]) == ["name", "uid", "resourceVersion", "creationTimestamp"]
        assert metrics["spec"] == {
            "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443},
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        }

        # current conditions as the store holds them
        server.gateway.store.set_apiservice_conditions(
            "v1beta1.metrics.k8s.io",
            (Condition("Available", "False", "2026-01-01T00:00:00Z", "MissingEndpoints", "no endpoints"),),
        )
        async with session.get(server.url + BASE + "/apiservices/v1beta1.metrics.k8s.io", ssl=ssl) as resp:
            got = await resp.json()
        assert got["status"] == {
            "conditions": [
                {
                    "type": "Available",
                    "status": "False",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": "MissingEndpoints",
                    "message": "no endpoints",
                }
            ]
        }
        assert got["metadata"]["uid"] == metrics["metadata"]["uid"]
        async with session.get(
            server.url + BASE + "/apiservices/v1beta1.metrics.k8s.io/status", ssl=ssl
        ) as resp:
            assert (await resp.json())["status"] == got["status"]

        async with session.get(server.url + BASE + "/apiservices/v1.nope", ssl=ssl) as resp:
            assert resp.status == 404
            assert await resp.read() == (
                b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                b'"message":"apiservices.apiregistration.k8s.io \\"v1.nope\\" not found","reason":"NotFound",'
                b'"details":{"name":"v1.nope","group":"apiregistration.k8s.io","kind":"apiservices"},"code":404}\n'
            )
        async with session.delete(server.url + BASE + "/apiservices/v1.apps", ssl=ssl) as resp:
            assert resp.status == 405
            status = await resp.json()
            assert status["reason"] == "MethodNotAllowed"
            assert status["message"].startswith(
                'delete is not supported on resources of kind "apiservices.apiregistration.k8s.io"'
            )
        async with session.post(server.url + BASE + "/apiservices", ssl=ssl, json={}) as resp:
            assert resp.status == 405
        assert server.gateway.store.apiservice("v1.apps") is not None

        async with session.get(
            server.url + BASE + "/apiservices?fieldSelector=metadata.name%3Dv1.apps", ssl=ssl
        ) as resp:
            assert [i["metadata"]["name"] for i in (await resp.json())["items"]] == ["v1.apps"]
        async with session.get(
            server.url + BASE + "/apiservices", ssl=ssl, headers={"Accept": TABLE}
        ) as resp:
            assert resp.headers["Content-Type"] == "application/json;g=meta.k8s.io;v=v1;as=Table"
            table = await resp.json()
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Service", "Available", "Age"]
        assert [r["cells"][:3] for r in table["rows"]] == [
            ["v1.apps", "Local", "True"],
            ["v1beta1.metrics.k8s.io", "kube-system/metrics-server", "False (MissingEndpoints)"],
        ]
        assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"

    # A list asked for as one object's metadata, an object as a list's: kube-apiserver's 406.
    async with aiohttp.ClientSession() as session:
        for path, kind, shape in (
            ("/apiservices", "PartialObjectMetadata", "a list (*v1.APIServiceList)"),
            ("/apiservices/v1.apps", "PartialObjectMetadataList", "not a list (*v1.APIService)"),
        ):
            accept = f"application/json;as={kind};v=v1;g=meta.k8s.io"
            async with session.get(server.url + BASE + path, ssl=ssl, headers={"Accept": accept}) as resp:
                assert resp.status == 406
                status = await resp.json()
            assert status["message"] == f"you requested {kind}, but the requested object is {shape}"


async def test_kubectl_get_apiservices(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI, tmp_path: Path
) -> None:
    write_manifests(
        apiservices_dir,
        [apiservice("v1beta1.metrics.k8s.io", 100, 100, service=("kube-system", "metrics-server"))],
    )
    server = await start_gateway()
    await conditions_recorded(server, "v1beta1.metrics.k8s.io")
    config = tmp_path / "kubeconfig"
    write_kubeconfig(
        config, kubeconfig(server.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, "admin"))
    )
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(config),
        "get",
        "apiservices",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split() == ["NAME", "SERVICE", "AVAILABLE", "AGE"]
    # The availability checker's verdict: there is no metrics-server Service in the folder.
    assert lines[1].split()[:4] == [
        "v1beta1.metrics.k8s.io",
        "kube-system/metrics-server",
        "False",
        "(ServiceNotFound)",
    ]

    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(config),
        "get",
        "apiservice",
        "v1beta1.metrics.k8s.io",
        "-o",
        "json",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["spec"]["service"]["name"] == "metrics-server"


@pytest.mark.e2e
@pytest.mark.skipif(not kubectl_binaries(), reason="kubectl is not installed")
@pytest.mark.parametrize("binary", kubectl_binaries(), ids=lambda b: Path(b).name)
async def test_kubectl_api_resources_lists_only_read_verbs(
    binary: str, start_gateway: StartGateway, apiservices_dir: Path, pki: PKI, tmp_path: Path
) -> None:
    """The folder is the source of truth: kubectl must not be told it may create or patch here."""
    write_manifests(apiservices_dir, [apiservice("v1.a.example.com", 100, 10, service=None)])
    server = await start_gateway()
    config = tmp_path / "kubeconfig"
    write_kubeconfig(
        config, kubeconfig(server.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, "admin"))
    )
    kubectl = Kubectl(binary, config, tmp_path / "home")
    _, out, _ = await kubectl("api-resources", "-o", "wide", "--api-group=apiregistration.k8s.io")
    header, *rows = out.splitlines()
    assert header.split()[-2:] == ["VERBS", "CATEGORIES"]
    assert [row.split() for row in rows] == [
        ["apiservices", "apiregistration.k8s.io/v1", "false", "APIService", "get,list,watch", "api-extensions"]
    ]
    # The legacy per-group-version document says the same (kubectl without aggregated discovery).
    _, out, _ = await kubectl("get", "--raw", BASE)
    assert {r["name"]: r["verbs"] for r in json.loads(out)["resources"]} == {
        "apiservices": ["get", "list", "watch"],
        "apiservices/status": ["get"],
    }


async def test_watch_from_a_listed_resource_version(
    start_gateway: StartGateway, apiservices_dir: Path, pki: PKI
) -> None:
    write_manifests(apiservices_dir, [apiservice("v1.a.example.com", 100, 10)])
    server = await start_gateway()
    ssl = pki.client_context()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + BASE + "/apiservices", ssl=ssl) as resp:
            revision = (await resp.json())["metadata"]["resourceVersion"]
        url = f"{server.url}{BASE}/apiservices?watch=true&resourceVersion={revision}&timeoutSeconds=5"
        async with session.get(url, ssl=ssl) as resp:
            assert resp.status == 200
            write_manifests(apiservices_dir, [apiservice("v1.b.example.com", 100, 10)])
            source = server.gateway.control.folder
            assert source is not None
            source.reload()
            events = [json.loads(await asyncio.wait_for(resp.content.readline(), 5)) for _ in range(2)]
        assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [
            ("ADDED", "v1.b.example.com"),
            ("DELETED", "v1.a.example.com"),
        ]
        # a watch without a resourceVersion starts with the current state
        url = f"{server.url}{BASE}/apiservices?watch=1&timeoutSeconds=1"
        async with session.get(url, ssl=ssl) as resp:
            first = json.loads(await asyncio.wait_for(resp.content.readline(), 5))
            assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "v1.b.example.com")
            assert await asyncio.wait_for(resp.content.read(), 5) == b""  # closed at timeoutSeconds
        async with session.get(
            f"{server.url}{BASE}/apiservices?watch=1&resourceVersion=abc", ssl=ssl
        ) as resp:
            assert resp.status == 400


# --- selectors: apimachinery's parser, not a second one --------------------------------------------


def _labelled(name: str, labels: dict[str, str]) -> APIService:
    from aggregator.model.apiservice import decode_apiservice

    doc = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name, "labels": labels},
        "spec": {"group": name.split(".", 1)[1], "version": name.split(".", 1)[0],
                 "groupPriorityMinimum": 1000, "versionPriority": 15},
    }  # fmt: skip
    return decode_apiservice(doc)


def test_selectors_are_parsed_as_apimachinery_parses_them() -> None:
    from aggregator.apiregistration.selectors import matches
    from aggregator.model.selectors import SelectorError

    svc = _labelled("v1.a.example.com", {"tier": "api", "team": "x"})
    assert matches(svc, "tier in (api, web),team", "metadata.name=v1.a.example.com")
    assert not matches(svc, "tier notin (api)", "")
    assert not matches(svc, "", "metadata.name!=v1.a.example.com")
    assert matches(svc, "!missing", "")
    with pytest.raises(SelectorError):
        matches(None, "tier in (api", "")
    with pytest.raises(ValueError, match=r"field label not supported: spec\.group"):
        matches(None, "", "spec.group=a.example.com")
