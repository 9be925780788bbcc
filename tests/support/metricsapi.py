"""A metrics.k8s.io APIService as metrics-server registers it, its backend dead or alive.

    docs = metrics_manifests(port, quarantine_after="100ms")   # APIService, Service, EndpointSlice
    backend = metrics_backend(backend_pki, front_proxy_ca, port)  # start() it to bring it back

The Service points at 127.0.0.1:`port`, where nothing listens until the backend is started; the
APIService skips TLS verification, as metrics-server's own manifests register it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.support.backend import SERVER_NAME, BackendPKI, FakeBackend

NAME = "v1beta1.metrics.k8s.io"
GROUP = "metrics.k8s.io"
GROUP_VERSION = "metrics.k8s.io/v1beta1"
QUARANTINE = "aggregator.dev/discovery-quarantine-after"
RESOURCES = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": GROUP_VERSION,
    "resources": [
        {"name": "nodes", "singularName": "", "namespaced": False, "kind": "NodeMetrics", "verbs": ["get", "list"]},
        {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics", "verbs": ["get", "list"]},
    ],
}  # fmt: skip


def metrics_manifests(port: int, *, quarantine_after: str | None = None) -> list[dict[str, Any]]:
    annotations = {QUARANTINE: quarantine_after} if quarantine_after is not None else {}
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": NAME, "annotations": annotations},
            "spec": {
                "group": GROUP,
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "insecureSkipTLSVerify": True,
                "service": {"namespace": "kube-system", "name": "metrics-server", "port": port},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": "kube-system", "name": "metrics-server"},
            "spec": {"clusterIP": "127.0.0.1", "ports": [{"name": "https", "port": port, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": "kube-system",
                "name": "metrics-server-1",
                "labels": {"kubernetes.io/service-name": "metrics-server"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        },
    ]


POD_METRICS_PATH = f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/pods"
_OPERATION = {"get": {"operationId": "listPodMetrics", "responses": {"200": {"description": "OK"}}}}
OPENAPI_V3 = {"openapi": "3.0.0", "info": {"title": "metrics-server", "version": "v0.7"}, "paths": {POD_METRICS_PATH: _OPERATION}}
OPENAPI_V2 = {"swagger": "2.0", "info": {"title": "metrics-server", "version": "v0.7"}, "paths": {POD_METRICS_PATH: _OPERATION}}


async def _resources(_request: web.Request) -> web.Response:
    return web.json_response(RESOURCES)


async def _v3_index(_request: web.Request) -> web.Response:
    url = f"/openapi/v3/apis/{GROUP_VERSION}?hash=ABC"
    return web.json_response({"paths": {f"apis/{GROUP_VERSION}": {"serverRelativeURL": url}}})


async def _v3(_request: web.Request) -> web.Response:
    return web.json_response(OPENAPI_V3)


async def _v2(_request: web.Request) -> web.Response:
    return web.json_response(OPENAPI_V2)


async def _not_found(_request: web.Request) -> web.Response:
    return web.json_response({"kind": "Status", "code": 404}, status=404)


def metrics_backend(backend_pki: BackendPKI, front_proxy_ca_file: str, port: int) -> FakeBackend:
    """metrics-server's discovery (legacy only) and OpenAPI on `port`, trusting `front_proxy_ca_file`."""
    cert, key = backend_pki.serving(f"metrics-{port}", [SERVER_NAME])
    return FakeBackend(
        cert,
        key,
        front_proxy_ca_file,
        port=port,
        routes={
            f"/apis/{GROUP_VERSION}": _resources,
            "/openapi/v3": _v3_index,
            f"/openapi/v3/apis/{GROUP_VERSION}": _v3,
            "/openapi/v2": _v2,
        },
        default=_not_found,
    )


def aggregated_versions(body: bytes) -> dict[str, str]:
    """`group/version` -> freshness in an aggregated discovery document."""
    doc = json.loads(body)
    return {
        f"{item['metadata'].get('name', '')}/{version['version']}": version.get("freshness", "")
        for item in doc["items"]
        for version in item["versions"]
    }


def legacy_groups(body: bytes) -> list[str]:
    return [group["name"] for group in json.loads(body)["groups"]]
