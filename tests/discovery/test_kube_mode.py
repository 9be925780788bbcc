"""Kube mode: kube-apiserver's own groups (built-ins, CRDs) in the gateway's aggregated `/apis`.

The fake kube-apiserver serves an aggregated discovery document written by hand in the order
kube-apiserver's ResourceManager produces (priority table, CRDs at 1000/100, unknown built-ins at
1000/15, group-name tie-break, `creationTimestamp: null` metadata as 1.33 writes it), with ETag and
304, v2/v2beta1 negotiation, or only the legacy APIGroupList. metrics.k8s.io is a remote APIService
whose TLS backend the gateway fetches itself. When everything is reachable, the gateway's document
must be kube-apiserver's, byte for byte, and so must its ETag.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.discovery.aggregated import STALE, merge_items
from aggregator.discovery.component import Discovery
from aggregator.discovery.delegated import (
    KUBE_APISERVER,
    DelegateDiscovery,
    DocumentError,
    Priorities,
    merge_entries,
    parse_document,
)
from aggregator.discovery.fetcher import FetchState
from aggregator.kube.calls import GET_APIS, is_declared
from aggregator.model.apiservice import decode_apiservice
from aggregator.runners.server import GatewayServer
from aggregator.sources.store import Store
from aggregator.tls.issue import load_pair
from tests.support.backend import BackendPKI, FakeBackend, endpointslice_manifest, service_manifest
from tests.support.e2e import Kubectl, kubectl_binaries, logged_requests
from tests.support.fakekube import GATEWAY_USER, FakeKube, kube_options
from tests.support.fixtures import backend_pki  # noqa: F401 - fixture
from tests.support.gateway import running_gateway
from tests.support.pki import PKI
from tests.support.polling import until

JSON = dict[str, Any]
DISCOVERY = "g=apidiscovery.k8s.io;v={};as=APIGroupDiscoveryList"
V2 = "application/json;" + DISCOVERY.format("v2")
V2BETA1 = "application/json;" + DISCOVERY.format("v2beta1")
KUBECTL_ACCEPT = f"{V2},{V2BETA1},application/json"
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
STATUS_VERBS = ["get", "patch", "update"]
AUTOMANAGED = "kube-aggregator.kubernetes.io/automanaged"


# --- kube-apiserver's documents, as it writes them ---------------------------------------------------


def gvk(kind: str, group: str = "", version: str = "") -> JSON:
    return {"group": group, "version": version, "kind": kind}


def sub(name: str, kind: str, verbs: list[str] | None = None, *, group: str = "", version: str = "") -> JSON:
    return {"subresource": name, "responseKind": gvk(kind, group, version), "verbs": verbs or STATUS_VERBS}


def res(
    name: str,
    kind: str,
    *,
    scope: str = "Namespaced",
    verbs: list[str] | None = None,
    short: list[str] | None = None,
    categories: list[str] | None = None,
    subresources: list[JSON] | None = None,
) -> JSON:
    out: JSON = {
        "resource": name,
        "responseKind": gvk(kind),
        "scope": scope,
        "singularResource": kind.lower(),
        "verbs": verbs or ALL_VERBS,
    }
    if short:
        out["shortNames"] = short
    if categories:
        out["categories"] = categories
    if subresources:
        out["subresources"] = subresources
    return out


def scale() -> JSON:
    return sub("scale", "Scale", group="autoscaling", version="v1")


def item(group: str, *versions: tuple[str, list[JSON]], freshness: str = "Current") -> JSON:
    """An APIGroupDiscovery as kube-apiserver 1.33 writes it (metadata with a null creationTimestamp)."""
    metadata: JSON = {"name": group, "creationTimestamp": None} if group else {"creationTimestamp": None}
    return {
        "metadata": metadata,
        "versions": [{"version": v, "resources": r, "freshness": freshness} for v, r in versions],
    }


METRICS = "metrics.k8s.io"
METRICS_RESOURCES = [
    res("nodes", "NodeMetrics", scope="Cluster", verbs=["get", "list"]),
    res("pods", "PodMetrics", verbs=["get", "list"]),
]
CRONTABS = [res("crontabs", "CronTab", short=["ct"], categories=["all"])]
HPA = res("horizontalpodautoscalers", "HorizontalPodAutoscaler", short=["hpa"], categories=["all"],
          subresources=[sub("status", "HorizontalPodAutoscaler")])  # fmt: skip


def kube_items() -> list[JSON]:
    """kube-apiserver's `/apis`, in the order its ResourceManager renders it (hand-ordered here)."""
    return [
        item("apiregistration.k8s.io", ("v1", [res("apiservices", "APIService", scope="Cluster",
             categories=["api-extensions"], subresources=[sub("status", "APIService")])])),  # 20001
        item("apps", ("v1", [
            res("controllerrevisions", "ControllerRevision"),
            res("daemonsets", "DaemonSet", short=["ds"], categories=["all"], subresources=[sub("status", "DaemonSet")]),
            res("deployments", "Deployment", short=["deploy"], categories=["all"],
                subresources=[scale(), sub("status", "Deployment")]),
            res("replicasets", "ReplicaSet", short=["rs"], categories=["all"],
                subresources=[scale(), sub("status", "ReplicaSet")]),
            res("statefulsets", "StatefulSet", short=["sts"], categories=["all"],
                subresources=[scale(), sub("status", "StatefulSet")]),
        ])),  # 17800
        item("events.k8s.io", ("v1", [res("events", "Event", short=["ev"])])),  # 17750
        item("autoscaling", ("v2", [HPA]), ("v1", [HPA])),  # 17500; v2 has versionPriority 30
        item("batch", ("v1", [
            res("cronjobs", "CronJob", short=["cj"], categories=["all"], subresources=[sub("status", "CronJob")]),
            res("jobs", "Job", categories=["all"], subresources=[sub("status", "Job")]),
        ])),  # 17400
        item("networking.k8s.io", ("v1", [
            res("ingressclasses", "IngressClass", scope="Cluster"),
            res("ingresses", "Ingress", short=["ing"], subresources=[sub("status", "Ingress")]),
            res("networkpolicies", "NetworkPolicy", short=["netpol"]),
        ])),  # 17200
        # 16700 both: the group name breaks the tie
        item("admissionregistration.k8s.io", ("v1", [
            res("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", scope="Cluster",
                categories=["api-extensions"]),
        ])),
        item("apiextensions.k8s.io", ("v1", [
            res("customresourcedefinitions", "CustomResourceDefinition", scope="Cluster", short=["crd", "crds"],
                categories=["api-extensions"], subresources=[sub("status", "CustomResourceDefinition")]),
        ])),
        # 1000 both: a CRD group (1000/100) and a built-in the priority table does not list (1000/15)
        item("stable.example.com", ("v1", CRONTABS), ("v1beta1", CRONTABS)),
        item("unlisted.k8s.io", ("v1alpha1", [res("things", "Thing")])),
        item(METRICS, ("v1beta1", METRICS_RESOURCES)),  # the remote APIService's own 100
    ]  # fmt: skip


def core_items() -> list[JSON]:
    return [
        item("", ("v1", [
            res("configmaps", "ConfigMap", short=["cm"]),
            res("namespaces", "Namespace", scope="Cluster", short=["ns"], subresources=[sub("status", "Namespace")]),
            res("pods", "Pod", short=["po"], categories=["all"], subresources=[sub("status", "Pod")]),
        ]))
    ]  # fmt: skip


def go_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class KubeDiscoveryEndpoints:
    """`/apis` and `/api` of the fake kube-apiserver, negotiated and cached as kube-apiserver does.

    `served` lists the aggregated versions it speaks (() = a kube-apiserver without aggregated
    discovery); `status` forces an error answer.
    """

    def __init__(self, fake: FakeKube, *, served: tuple[str, ...] = ("v2", "v2beta1")) -> None:
        self.apis = kube_items()
        self.api = core_items()
        self.served = served
        self.status: int | None = None
        fake.add_route("GET", "/apis", self._serve_apis)
        fake.add_route("GET", "/api", self._serve_api)

    @staticmethod
    def etag(items: list[JSON]) -> str:
        return '"' + hashlib.sha512(go_json({"metadata": {}, "items": items})).hexdigest().upper() + '"'

    @staticmethod
    def body(items: list[JSON], version: str = "v2") -> bytes:
        doc = {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": f"apidiscovery.k8s.io/{version}",
            "metadata": {},
            "items": items,
        }
        return go_json(doc) + b"\n"

    def negotiate(self, accept: str) -> str | None:
        for clause in accept.split(","):
            params = dict(p.strip().partition("=")[::2] for p in clause.split(";")[1:])
            if (
                params.get("g") == "apidiscovery.k8s.io"
                and params.get("as") == "APIGroupDiscoveryList"
                and params.get("v") in self.served
            ):
                return params["v"]
        return None

    def _aggregated(self, request: web.Request, items: list[JSON]) -> web.Response | None:
        version = self.negotiate(request.headers.get("Accept", ""))
        if version is None:
            return None
        etag = self.etag(items)
        headers = {
            "Etag": etag,
            "Vary": "Accept",
            "Cache-Control": "public",
            "Content-Type": f"application/json;{DISCOVERY.format(version)}",
        }
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body(items, version), headers=headers)

    async def _serve_apis(self, request: web.Request) -> web.Response:
        if self.status is not None:
            return web.json_response({"kind": "Status", "message": "etcd is sad"}, status=self.status)
        answer = self._aggregated(request, self.apis)
        if answer is not None:
            return answer
        groups = [
            {
                "name": i["metadata"]["name"],
                "versions": [
                    {"groupVersion": f"{i['metadata']['name']}/{v['version']}", "version": v["version"]}
                    for v in i["versions"]
                ],
            }
            for i in self.apis
        ]
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _serve_api(self, request: web.Request) -> web.Response:
        answer = self._aggregated(request, self.api)
        if answer is not None:
            return answer
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})


# --- the cluster's objects ----------------------------------------------------------------------------


def local_apiservice(group: str, version: str, gpm: int, vp: int, managed: str) -> JSON:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}", "labels": {AUTOMANAGED: managed}},
        "spec": {"group": group, "version": version, "groupPriorityMinimum": gpm, "versionPriority": vp},
    }


BUILTIN_APISERVICES = [
    ("", "v1", 18000, 1),
    ("apiregistration.k8s.io", "v1", 18700, 15),  # its spec says 18700; aggregated discovery pins 20001
    ("apps", "v1", 17800, 15),
    ("events.k8s.io", "v1", 17750, 15),
    ("autoscaling", "v2", 17500, 30),
    ("autoscaling", "v1", 17500, 15),
    ("batch", "v1", 17400, 15),
    ("networking.k8s.io", "v1", 17200, 15),
    ("admissionregistration.k8s.io", "v1", 16700, 15),
    ("apiextensions.k8s.io", "v1", 16700, 15),
]


def metrics_apiservice(port: int, ca_pem: bytes) -> JSON:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"v1beta1.{METRICS}"},
        "spec": {
            "group": METRICS,
            "version": "v1beta1",
            "service": {"namespace": "kube-system", "name": "metrics-server", "port": port},
            "caBundle": base64.b64encode(ca_pem).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
        "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]},
    }


def populate(fake: FakeKube, metrics_port: int, ca_pem: bytes) -> None:
    for group, version, gpm, vp in BUILTIN_APISERVICES:
        fake.add_object("apiservices", local_apiservice(group, version, gpm, vp, "onstart"))
    for version in ("v1", "v1beta1"):
        fake.add_object("apiservices", local_apiservice("stable.example.com", version, 1000, 100, "true"))
    fake.add_object("apiservices", metrics_apiservice(metrics_port, ca_pem))
    fake.add_object(
        "services", service_manifest(port=metrics_port, namespace="kube-system", name="metrics-server")
    )
    fake.add_object(
        "endpointslices",
        endpointslice_manifest(
            "metrics-server-1",
            [("127.0.0.1", True)],
            port=metrics_port,
            namespace="kube-system",
            service="metrics-server",
        ),
    )


async def metrics_apis(request: web.Request) -> web.Response:
    """metrics-server's own aggregated `/apis` (the same resources kube-apiserver's aggregator lists)."""
    body = go_json({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
                    "items": [{"metadata": {"name": METRICS}, "versions": [
                        {"version": "v1beta1", "resources": METRICS_RESOURCES, "freshness": "Current"}]}]})  # fmt: skip
    etag = '"M1"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(body=body, headers={"Content-Type": V2, "ETag": etag})


# --- a kube-mode gateway on the fake ------------------------------------------------------------------


class Cluster:
    """The fake kube-apiserver with its discovery, a metrics-server backend, and a gateway in front."""

    def __init__(
        self, fake: FakeKube, endpoints: KubeDiscoveryEndpoints, backend: FakeBackend, pki: PKI
    ) -> None:
        self.fake = fake
        self.endpoints = endpoints
        self.backend = backend
        self.pki = pki
        self.server: GatewayServer | None = None

    @property
    def discovery(self) -> Discovery:
        assert self.server is not None
        return self.server.gateway.control.discovery

    @property
    def delegate(self) -> DelegateDiscovery:
        delegate = self.discovery.delegate
        assert delegate is not None
        return delegate

    def metrics_state(self) -> FetchState | None:
        return self.discovery.fetcher.states.get(f"v1beta1.{METRICS}")

    async def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, CIMultiDict[str], bytes]:
        assert self.server is not None
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.server.url + path, headers=headers or {}, ssl=self.pki.client_context()) as resp,
        ):
            return resp.status, resp.headers.copy(), await resp.read()

    async def aggregated(self, accept: str = V2) -> JSON:
        status, _, body = await self.get("/apis", {"Accept": accept})
        assert status == 200, body
        doc: JSON = json.loads(body)
        return doc

    async def settled(self) -> None:
        """Until kube-apiserver's document is loaded and metrics-server's fetched by the gateway."""
        await until(
            lambda: (
                self.delegate.document is not None
                and (state := self.metrics_state()) is not None
                and state.fresh
            ),
            what="kube-apiserver's and metrics-server's discovery",
        )


StartCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def start_cluster(
    fake_kube: FakeKube,
    pki: PKI,
    backend_pki: BackendPKI,  # noqa: F811
) -> AsyncIterator[StartCluster]:
    """`await start_cluster(served=..., **gateway_options)`: everything running and registered.

    The gateway's front-proxy certificate is one the fake kube-apiserver accepts (the delegate
    presents it), and metrics-server trusts that certificate's CA, as a cluster's would.
    """
    front_proxy = fake_kube.issue_client_cert("front-proxy-client", stem="front-proxy-for-fake")
    cert, key = backend_pki.serving("metrics-server", ["metrics-server.kube-system.svc"])
    async with AsyncExitStack() as stack:

        async def start(*, served: tuple[str, ...] = ("v2", "v2beta1"), **overrides: Any) -> Cluster:
            endpoints = KubeDiscoveryEndpoints(fake_kube, served=served)
            backend = FakeBackend(cert, key, str(fake_kube.dir / "client-ca.crt"))
            backend.routes["/apis"] = metrics_apis
            await backend.start()
            stack.push_async_callback(backend.stop)
            populate(fake_kube, backend.port, backend_pki.ca.cert_pem)
            assert fake_kube.kubeconfig is not None
            settings: dict[str, Any] = {
                "proxy_client_cert_file": str(front_proxy[0]),
                "proxy_client_key_file": str(front_proxy[1]),
            }
            settings.update(overrides)
            options = kube_options(pki, fake_kube.kubeconfig, **settings)
            cluster = Cluster(fake_kube, endpoints, backend, pki)
            cluster.server = await stack.enter_async_context(running_gateway(options))
            fetcher = cluster.discovery.fetcher
            fetcher.backoff_initial, fetcher.backoff_max, fetcher.timeout = 0.02, 0.2, 1.0
            delegate = cluster.delegate
            delegate.backoff_initial, delegate.backoff_max = 0.02, 0.2
            return cluster

        yield start


def names(doc: JSON) -> list[str]:
    return [i["metadata"].get("name", "") for i in doc["items"]]


def fetches(cluster: Cluster, result: str) -> float:
    assert cluster.server is not None
    value = cluster.server.gateway.metrics.registry.get_sample_value(
        "aggregator_discovery_fetches_total", {"apiservice": KUBE_APISERVER, "result": result}
    )
    return value or 0.0


# --- units: priorities and merge ------------------------------------------------------------------------


def store_with(*manifests: JSON) -> Store:
    store = Store()
    for manifest in manifests:
        store.upsert(decode_apiservice(manifest))
    return store


def remote(group: str, version: str, gpm: int, vp: int) -> JSON:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"},
        "spec": {
            "group": group,
            "version": version,
            "service": {"namespace": "ns", "name": "svc"},
            "groupPriorityMinimum": gpm,
            "versionPriority": vp,
        },
    }


def test_kube_apiservers_apis_is_a_declared_discovery_call() -> None:
    # tests/manifests/test_rbac.py checks every declared call against the RBAC (system:discovery here).
    assert is_declared(GET_APIS)
    assert GET_APIS.url_path() == "/apis" and GET_APIS.method == "GET"


def test_priorities_are_the_resource_managers_per_source() -> None:
    store = store_with(
        remote(METRICS, "v1beta1", 100, 100),
        local_apiservice("apps", "v1", 5, 5, "onstart"),  # a local APIService's spec never counts
        local_apiservice("stable.example.com", "v1", 7, 7, "true"),
        local_apiservice("hand.example.com", "v1", 9000, 90, ""),  # local, not a CRD's
        remote("batch", "v1", 300, 30),  # a remote APIService wins over the built-in source
    )
    priority = Priorities(store)
    assert priority("apiregistration.k8s.io", "v1") == (20001, 0)
    assert priority(METRICS, "v1beta1") == (100, 100)
    assert priority("apps", "v1") == (17800, 15)
    assert priority("autoscaling", "v2") == (17500, 30)
    assert priority("stable.example.com", "v1") == (1000, 100)
    assert priority("stable.example.com", "v2") == (1000, 15)  # no APIService yet: nothing says CRD
    assert priority("hand.example.com", "v1") == (1000, 15)
    assert priority("batch", "v1") == (300, 30)


def document(*items: JSON) -> bytes:
    return KubeDiscoveryEndpoints.body(list(items))


def test_a_crd_version_outranks_a_remote_one_in_the_same_group_only_when_recognised() -> None:
    kube = parse_document(
        document(item("mixed.example.com", ("v1", CRONTABS), ("v2", [res("others", "Other")])))
    )
    crd = local_apiservice("mixed.example.com", "v1", 1000, 100, "true")
    served = FetchState(decode_apiservice(remote("mixed.example.com", "v2", 500, 50)))
    served.fresh, served.resources = True, (res("others", "Other"),)
    for label, expected in (("true", ["v1", "v2"]), ("onstart", ["v2", "v1"])):
        crd["metadata"]["labels"][AUTOMANAGED] = label
        store = store_with(crd, remote("mixed.example.com", "v2", 500, 50))
        items = merge_items(merge_entries(kube, [served], Priorities(store)), kube.group_metadata)
        assert [v["version"] for v in items[0]["versions"]] == expected, label


def test_built_in_groups_are_ordered_by_the_priority_table() -> None:
    """Groups kube-apiserver lists in any order come out by the table's priorities, unknown ones last."""
    kube = parse_document(
        document(
            item("future.k8s.io", ("v1", [])),
            item("storagemigration.k8s.io", ("v1beta1", [])),
            item("resource.k8s.io", ("v1alpha3", []), ("v1beta2", []), ("v1beta1", [])),
            item("flowcontrol.apiserver.k8s.io", ("v1beta3", []), ("v1", [])),
            item("discovery.k8s.io", ("v1", [])),
            item("coordination.k8s.io", ("v1alpha2", []), ("v1", []), ("v1beta1", [])),
        )
    )
    entries = merge_entries(kube, [], Priorities(Store()))
    assert {(e.group, e.version): (e.group_priority, e.version_priority) for e in entries}[
        ("resource.k8s.io", "v1beta2")
    ] == (16200, 15)
    items = merge_items(entries, kube.group_metadata)
    assert [(i["metadata"]["name"], [v["version"] for v in i["versions"]]) for i in items] == [
        ("coordination.k8s.io", ["v1", "v1beta1", "v1alpha2"]),  # 16500
        ("discovery.k8s.io", ["v1"]),  # 16200, ties by name
        ("resource.k8s.io", ["v1beta2", "v1beta1", "v1alpha3"]),  # 16200
        ("flowcontrol.apiserver.k8s.io", ["v1", "v1beta3"]),  # 16100
        ("storagemigration.k8s.io", ["v1beta1"]),  # 15800
        ("future.k8s.io", ["v1"]),  # not in the table: 1000/15
    ]


def test_kube_apiservers_copy_stands_in_until_the_gateways_first_fetch_ends() -> None:
    kube = parse_document(document(item(METRICS, ("v1beta1", METRICS_RESOURCES), freshness="Stale")))
    state = FetchState(decode_apiservice(remote(METRICS, "v1beta1", 100, 100)))
    store = store_with(remote(METRICS, "v1beta1", 100, 100))
    (entry,) = merge_entries(kube, [state], Priorities(store))
    assert (entry.group_priority, entry.version_priority) == (100, 100)
    assert list(entry.resources or ()) == METRICS_RESOURCES and entry.freshness == "Stale"  # kube's view
    state.failures = 1  # the gateway tried and failed: its own verdict from now on
    (entry,) = merge_entries(kube, [state], Priorities(store))
    assert entry.resources is None and entry.freshness == STALE
    (entry,) = merge_entries(None, [state], Priorities(store))  # kube-apiserver's not fetched yet
    assert entry.freshness == STALE


def test_v2beta1_documents_and_group_metadata_styles() -> None:
    old = parse_document(KubeDiscoveryEndpoints.body([item("apps", ("v1", []))], "v2beta1"), '"E"')
    assert [(v.group, v.version, v.resources) for v in old.versions] == [("apps", "v1", ())]
    assert old.etag == '"E"'
    assert old.group_metadata("apps") == {"name": "apps", "creationTimestamp": None}
    # a group only the gateway knows is written in kube-apiserver's style (<= 1.33: a null timestamp)
    assert (
        go_json(old.group_metadata("new.example.com"))
        == b'{"name":"new.example.com","creationTimestamp":null}'
    )
    new = parse_document(
        go_json({"kind": "APIGroupDiscoveryList", "items": [{"metadata": {"name": "apps"}}]})
    )
    assert new.group_metadata("new.example.com") == {"name": "new.example.com"}
    with pytest.raises(DocumentError, match="not an APIGroupDiscoveryList"):
        parse_document(go_json({"kind": "APIGroupList", "groups": []}))


# --- through the gateway --------------------------------------------------------------------------------


async def test_the_document_is_kube_apiservers_when_every_backend_is_reachable(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster()
    await cluster.settled()
    status, headers, body = await cluster.get("/apis", {"Accept": KUBECTL_ACCEPT})
    assert status == 200
    expected = cluster.endpoints.body(cluster.endpoints.apis)
    assert body == expected  # byte for byte: order, priorities, metadata, resources, freshness
    assert headers["ETag"] == cluster.endpoints.etag(cluster.endpoints.apis)
    assert headers["Content-Type"] == V2
    assert names(json.loads(body)) == [
        "apiregistration.k8s.io",
        "apps",
        "events.k8s.io",
        "autoscaling",
        "batch",
        "networking.k8s.io",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "stable.example.com",
        "unlisted.k8s.io",
        METRICS,
    ]
    # metrics.k8s.io came from metrics-server itself, fetched as the gateway's front-proxy identity
    assert cluster.backend.seen_by("system:kube-aggregator")
    # kube-apiserver's document was fetched as the gateway's own kube-apiserver identity, v2 first
    (first, *_) = [r for r in cluster.fake.requests if r.path == "/apis"]
    assert first.user == GATEWAY_USER
    assert fetches(cluster, "aggregated") == 1

    # the next fetch revalidates with the ETag: a 304, nothing re-rendered
    rendered = cluster.discovery.aggregated.document()
    cluster.delegate.poke()
    await until(lambda: fetches(cluster, "not_modified") >= 1, what="a 304 from kube-apiserver")
    assert cluster.discovery.aggregated.document() is rendered

    # the v2beta1 form of the same document (older kubectl)
    status, headers, body = await cluster.get("/apis", {"Accept": V2BETA1})
    assert body == cluster.endpoints.body(cluster.endpoints.apis, "v2beta1")
    # legacy /apis still lists the APIService groups, kube-aggregator's way
    status, _, body = await cluster.get("/apis", {"Accept": "application/json"})
    legacy = json.loads(body)
    assert legacy["kind"] == "APIGroupList" and legacy["groups"][0]["name"] == "apiregistration.k8s.io"


async def test_a_backend_down_is_stale_with_its_resources_and_kube_apiservers_groups_stay_current(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster()
    await cluster.settled()
    await cluster.backend.stop()
    state = cluster.metrics_state()
    assert state is not None
    cluster.discovery.fetcher.poke(state.apiservice.name)
    try:
        await until(lambda: not state.fresh and state.failures > 0, what="metrics-server's fetch failing")
    except AssertionError as err:  # seen once on a loaded machine: say what the fetcher was doing
        loops = cluster.discovery.fetcher.loops
        raise AssertionError(
            f"{err}: state {state.fresh=} {state.failures=} {state.last_error=}, the same object: "
            f"{cluster.metrics_state() is state}; loop runs {loops.runs}, wakeups {loops.wakeups}"
        ) from None
    doc = await cluster.aggregated()
    kube = {i["metadata"]["name"]: i for i in cluster.endpoints.apis}
    for entry in doc["items"]:
        name = entry["metadata"]["name"]
        if name == METRICS:
            assert entry["versions"] == [
                {"version": "v1beta1", "resources": METRICS_RESOURCES, "freshness": "Stale"}
            ]
        else:
            assert entry == kube[name]  # kube-apiserver's, Current
    assert names(doc) == [i["metadata"]["name"] for i in cluster.endpoints.apis]


async def test_new_crd_groups_appear_after_their_apiservice_and_at_the_refresh(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster()
    await cluster.settled()
    fake, endpoints = cluster.fake, cluster.endpoints

    # kube-apiserver publishes a new CRD's group a moment after the crdregistration controller
    # created its APIService: the follow-up fetches after the APIService event catch it
    backups = [res("backups", "Backup", short=["bk"])]
    fetches = fake.counts[("GET", "/apis")]
    fake.add_object("apiservices", local_apiservice("ops.example.com", "v1", 1000, 100, "true"))
    await until(lambda: fake.counts[("GET", "/apis")] > fetches, what="the fetch the APIService event asks for")
    endpoints.apis.insert(8, item("ops.example.com", ("v1", backups)))  # 1000, before stable.example.com
    await until(lambda: "ops.example.com" in names(json.loads(cluster.discovery.aggregated.document().json)),
                what="the new CRD group")  # fmt: skip
    _, _, body = await cluster.get("/apis", {"Accept": V2})
    assert body == endpoints.body(endpoints.apis)

    # a change without any APIService event (a CRD's new resource) shows at the next refresh
    delegate = cluster.delegate
    delegate.refresh_interval = 0.1
    delegate.poke()
    endpoints.apis[8]["versions"][0]["resources"].append(res("restores", "Restore"))
    await until(
        lambda: b'"restores"' in cluster.discovery.aggregated.document().json, what="the periodic refresh"
    )
    _, _, body = await cluster.get("/apis", {"Accept": V2})
    assert body == endpoints.body(endpoints.apis)

    # a CRD deleted: its APIService goes, then its group
    fake.delete_object("apiservices", "v1.ops.example.com")
    del endpoints.apis[8]
    await until(lambda: "ops.example.com" not in names(json.loads(cluster.discovery.aggregated.document().json)),
                what="the CRD group gone")  # fmt: skip


async def test_until_kube_apiserver_answers_only_aggregated_groups_are_served(
    start_cluster: StartCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aggregator.discovery.delegated")
    cluster = await start_cluster()
    cluster.endpoints.status = 503
    await until(lambda: fetches(cluster, "error") >= 1, what="a failed fetch")
    cluster.delegate.poke()
    await until(lambda: fetches(cluster, "error") >= 3, what="retries with backoff")
    await until(lambda: (s := cluster.metrics_state()) is not None and s.fresh, what="metrics-server fetched")
    doc = await cluster.aggregated()
    assert names(doc) == [METRICS]  # what the gateway has: its own fetch, no apiregistration stand-in
    assert doc["items"][0]["metadata"] == {"name": METRICS}  # kube-apiserver's style not known yet
    mine = [r for r in caplog.records if r.name == "aggregator.discovery.delegated"]
    warnings = [r for r in mine if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # once per state change, not once per retry
    assert "etcd is sad" in str(warnings[0].__dict__.get("fields"))

    cluster.endpoints.status = None
    await until(lambda: cluster.delegate.document is not None, what="the document after recovery")
    _, _, body = await cluster.get("/apis", {"Accept": V2})
    assert body == cluster.endpoints.body(cluster.endpoints.apis)
    mine = [r for r in caplog.records if r.name == "aggregator.discovery.delegated"]
    assert [r.getMessage() for r in mine if r.levelno == logging.INFO] == [
        "kube-apiserver's discovery recovered"
    ]


async def test_a_v2beta1_only_kube_apiserver_is_understood(start_cluster: StartCluster) -> None:
    cluster = await start_cluster(served=("v2beta1",))  # kube-apiserver 1.26-1.29
    await cluster.settled()
    assert cluster.delegate.served_version == "v2beta1"
    _, _, body = await cluster.get("/apis", {"Accept": V2})
    assert body == cluster.endpoints.body(cluster.endpoints.apis, "v2")


async def test_a_kube_apiserver_without_aggregated_discovery_makes_apis_legacy_only(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(served=())
    await until(lambda: cluster.delegate.attempted, what="the first fetch")
    # Every fetch so far (the APIServices listed at start poke follow-up fetches) found legacy only.
    assert cluster.delegate.legacy_only and fetches(cluster, "legacy") >= 1
    assert fetches(cluster, "aggregated") == 0 and fetches(cluster, "error") == 0
    status, _, body = await cluster.get("/apis", {"Accept": V2})
    assert status == 406  # as that kube-apiserver answers an aggregated-only Accept
    status, _, body = await cluster.get("/apis", {"Accept": KUBECTL_ACCEPT})
    assert status == 200 and json.loads(body)["kind"] == "APIGroupList"

    cluster.endpoints.served = ("v2",)  # the cluster upgraded
    cluster.delegate.poke()
    await until(lambda: not cluster.delegate.legacy_only, what="aggregated discovery again")
    await cluster.settled()
    status, _, body = await cluster.get("/apis", {"Accept": KUBECTL_ACCEPT})
    assert body == cluster.endpoints.body(cluster.endpoints.apis)


async def test_api_goes_to_kube_apiserver_and_comes_back_unchanged(start_cluster: StartCluster) -> None:
    cluster = await start_cluster()
    status, headers, body = await cluster.get("/api", {"Accept": KUBECTL_ACCEPT})
    assert status == 200
    assert body == cluster.endpoints.body(cluster.endpoints.api)
    assert headers["Content-Type"] == V2
    etag = cluster.endpoints.etag(cluster.endpoints.api)
    assert headers["Etag"] == etag
    status, headers, body = await cluster.get("/api", {"Accept": V2, "If-None-Match": etag})
    assert status == 304 and body == b""
    status, _, body = await cluster.get("/api", {"Accept": "application/json"})
    assert json.loads(body) == {"kind": "APIVersions", "versions": ["v1"]}
    seen = [r for r in cluster.fake.requests if r.path == "/api"]
    assert len(seen) == 3 and {r.user for r in seen} == {
        "front-proxy-client"
    }  # the caller's, via the delegate


async def test_readyz_waits_for_the_first_fetch_of_kube_apiservers_discovery(
    start_cluster: StartCluster, fake_kube: FakeKube
) -> None:
    fake_kube.slow(30, verb="GET", resource="/apis")
    cluster = await start_cluster()
    await until(lambda: fake_kube.count("GET", "/apis") == 1, what="the fetch sent")
    status, _, body = await cluster.get("/readyz?verbose")
    assert status == 500 and b"[-]kube-apiserver-discovery failed" in body
    fake_kube.release()
    await until(lambda: cluster.delegate.attempted, what="the first fetch")
    status, _, body = await cluster.get("/readyz?verbose")
    assert status == 200 and b"[+]kube-apiserver-discovery ok" in body


# --- real kubectl -----------------------------------------------------------------------------------------

KUBECTLS = kubectl_binaries()


@pytest.mark.e2e
@pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed")
@pytest.mark.parametrize("binary", KUBECTLS, ids=lambda b: Path(b).name)
async def test_kubectl_api_resources_lists_kube_apiservers_and_the_aggregated_groups(
    binary: str, start_cluster: StartCluster, pki: PKI, tmp_path: Path
) -> None:
    cluster = await start_cluster()
    await cluster.settled()
    assert cluster.server is not None
    config = tmp_path / "admin.kubeconfig"
    ca = Path(pki.path("ca.crt")).read_bytes()
    write_kubeconfig(config, kubeconfig(cluster.server.url, ca, load_pair(pki.dir, "admin")))
    kubectl = Kubectl(binary, config, tmp_path / "home")

    _, out, err = await kubectl("api-resources", "-v=8")
    rows = {tuple(re.split(r"\s+", line.strip())) for line in out.splitlines()[1:]}
    for row in [
        ("pods", "po", "v1", "true", "Pod"),
        ("namespaces", "ns", "v1", "false", "Namespace"),
        ("deployments", "deploy", "apps/v1", "true", "Deployment"),
        ("controllerrevisions", "apps/v1", "true", "ControllerRevision"),
        ("cronjobs", "cj", "batch/v1", "true", "CronJob"),
        ("jobs", "batch/v1", "true", "Job"),
        ("horizontalpodautoscalers", "hpa", "autoscaling/v2", "true", "HorizontalPodAutoscaler"),
        (
            "customresourcedefinitions",
            "crd,crds",
            "apiextensions.k8s.io/v1",
            "false",
            "CustomResourceDefinition",
        ),
        ("crontabs", "ct", "stable.example.com/v1", "true", "CronTab"),
        ("nodes", "metrics.k8s.io/v1beta1", "false", "NodeMetrics"),
        ("pods", "metrics.k8s.io/v1beta1", "true", "PodMetrics"),
    ]:
        assert row in rows, (row, out)
    # one request each for /api and /apis: everything came from the two aggregated documents
    paths = [r.path for r in logged_requests(err)]
    assert sorted(paths) == ["/api", "/apis"], paths

    # metrics-server down: kubectl still lists everything else; the Stale group-version it leaves out
    await cluster.backend.stop()
    state = cluster.metrics_state()
    assert state is not None
    cluster.discovery.fetcher.poke(state.apiservice.name)
    await until(lambda: not state.fresh, what="metrics-server's fetch failing")
    _, out, _ = await Kubectl(binary, config, tmp_path / "home2")("api-resources", check=False)
    assert "deployments" in out and "crontabs" in out and "customresourcedefinitions" in out
    assert "NodeMetrics" not in out


async def test_no_backend_is_reported_missing_while_the_services_are_still_being_listed(
    start_cluster: StartCluster, fake_kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver lists Services a second after APIServices: discovery, OpenAPI and availability
    wait for the store's first sync instead of reporting `service "metrics-server" not found`."""
    caplog.set_level(logging.DEBUG)
    fake_kube.slow(1.0, verb="list", resource="services")
    cluster = await start_cluster()
    await cluster.settled()
    assert cluster.server is not None
    gateway = cluster.server.gateway
    assert gateway.control.availability.is_available(f"v1beta1.{METRICS}")
    missing = [str(getattr(r, "fields", "")) for r in caplog.records if "not found" in str(getattr(r, "fields", ""))]
    assert missing == [], missing
    registry = gateway.metrics.registry
    for kind in ("service", "port", "endpoints"):
        assert not registry.get_sample_value(
            "aggregator_backend_errors_total", {"apiservice": f"v1beta1.{METRICS}", "kind": kind}
        )
