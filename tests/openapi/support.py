"""Fake extension servers that publish OpenAPI, and helpers to read what the gateway publishes.

`OpenAPIBackend` is a FakeBackend (real TLS, front-proxy client certificate required) whose
`/openapi/v3`, `/openapi/v3/<gv>` and `/openapi/v2` answer from documents a test sets, the way
kube-openapi serves them (hash in the index, a stale `?hash=` redirected to the current one, ETag +
If-None-Match; `tests/support/fakeopenapi.py`); `status` forces an answer code per document ("v2",
"v3") to simulate a server without OpenAPI or a broken one, `settle(n)` moves every document right
after each of the next `n` index answers, and `redirects` sends a document's GET elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from aggregator.assembly import Gateway
from aggregator.openapi.component import OpenAPIAggregation
from tests.support.backend import (
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
    write_manifests,
)
from tests.support.fakeopenapi import group_version_response
from tests.support.pki import PKI

JSON = dict[str, Any]


def sha512_upper(data: bytes) -> str:
    return hashlib.sha512(data).hexdigest().upper()


def _root(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


def v3_document(group: str, version: str, kind: str, description: str = "") -> JSON:
    name = f"com.example.{group.split('.')[0] or 'core'}.{version}.{kind}"
    return {
        "openapi": "3.0.0",
        "info": {"title": group, "version": version},
        "paths": {f"{_root(group, version)}/{kind.lower()}s": {"get": {"operationId": f"list{kind}"}}},
        "components": {
            "schemas": {
                name: {
                    "description": description or f"{kind} of {group}/{version}",
                    "type": "object",
                    "x-kubernetes-group-version-kind": [{"group": group, "kind": kind, "version": version}],
                }
            }
        },
    }


def v2_paths(group: str, version: str, kind: str, definition: str) -> JSON:
    ref = {"$ref": f"#/definitions/{definition}"}
    gvk = {"group": group, "kind": kind, "version": version}
    return {
        f"{_root(group, version)}/": {
            "get": {"operationId": f"getResources{kind}", "responses": {"200": {"description": "OK"}}}
        },
        f"{_root(group, version)}/{kind.lower()}s": {
            "get": {
                "operationId": f"list{kind}",
                "responses": {"200": {"description": "OK", "schema": ref}},
                "x-kubernetes-action": "list",
                "x-kubernetes-group-version-kind": gvk,
            }
        },
    }


@dataclass
class OpenAPIBackend:
    backend: FakeBackend
    v3: dict[str, JSON] = field(default_factory=dict)  # gv key -> document
    v2: JSON | None = None
    status: dict[str, int] = field(default_factory=dict)  # "v2"/"v3" -> forced status
    v2_etag: bool = True
    hashes: bool = True  # put ?hash= in the v3 index
    extra_index: dict[str, str] = field(default_factory=dict)  # more index keys -> serverRelativeURL
    redirects: dict[str, str] = field(default_factory=dict)  # gv key -> Location of a 301
    settling: int = 0

    def __post_init__(self) -> None:
        self.backend.routes["/openapi/v2"] = self._v2
        self.backend.routes["/openapi/v3"] = self._v3_index
        self.backend.default = self._other

    @property
    def port(self) -> int:
        return self.backend.port

    def settle(self, index_reads: int) -> None:
        self.settling = index_reads

    def requests(self, path: str) -> list[Any]:
        return [r for r in self.backend.received if r.raw_path.split("?")[0] == path]

    def _body(self, doc: JSON) -> bytes:
        return json.dumps(doc, separators=(",", ":")).encode()

    async def _v2(self, request: web.Request) -> web.StreamResponse:
        if "v2" in self.status:
            return web.Response(status=self.status["v2"], text="nope")
        assert self.v2 is not None
        body = self._body(self.v2)
        headers = {"Content-Type": "application/json"}
        if self.v2_etag:
            etag = f'"{sha512_upper(body)}"'
            headers["Etag"] = etag
            if request.headers.get("If-None-Match") == etag:
                return web.Response(status=304, headers=headers)
        return web.Response(body=body, headers=headers)

    async def _v3_index(self, request: web.Request) -> web.StreamResponse:
        if "v3" in self.status:
            return web.Response(status=self.status["v3"], text="nope")
        paths = {}
        for key, doc in self.v3.items():
            url = f"/openapi/v3/{key}"
            if self.hashes:
                url += f"?hash={sha512_upper(self._body(doc))}"
            paths[key] = {"serverRelativeURL": url}
        paths.update({k: {"serverRelativeURL": v} for k, v in self.extra_index.items()})
        if self.settling > 0:  # the documents change right after this index was read
            self.settling -= 1
            for key, doc in self.v3.items():
                self.v3[key] = {**doc, "info": {**doc.get("info", {}), "x-revision": self.settling}}
        return web.json_response({"paths": paths})

    async def _other(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/openapi/v3/"):
            key = request.path.removeprefix("/openapi/v3/")
            if key in self.redirects:
                return web.Response(status=301, headers={"Location": self.redirects[key]})
            doc = self.v3.get(key)
            if doc is None:
                return web.Response(status=404)
            return group_version_response(request, key, self._body(doc), 0.0)
        return web.Response(status=404)


async def start_backend(
    backend_pki: BackendPKI, pki: PKI, namespace: str, name: str = "api"
) -> OpenAPIBackend:
    cert, key = backend_pki.serving(f"{namespace}-{name}", [f"{name}.{namespace}.svc"])
    fake = FakeBackend(cert, key, pki.path("front-proxy-ca.crt"))
    await fake.start()
    return OpenAPIBackend(fake)


def register(
    folder: Path,
    backend: OpenAPIBackend,
    backend_pki: BackendPKI,
    namespace: str,
    group_versions: list[tuple[str, str, int, int]],
    name: str = "api",
) -> Path:
    """APIServices (group, version, GPM, VP) served by `backend` as Service `namespace/name`."""
    docs = []
    for group, version, gpm, vp in group_versions:
        manifest = apiservice_manifest(
            port=backend.port,
            ca_pem=backend_pki.ca.cert_pem,
            group=group,
            version=version,
            namespace=namespace,
            service=name,
        )
        manifest["spec"]["groupPriorityMinimum"] = gpm
        manifest["spec"]["versionPriority"] = vp
        docs.append(manifest)
    docs.append(service_manifest(port=backend.port, namespace=namespace, name=name))
    docs.append(
        endpointslice_manifest(
            f"{name}-1", [("127.0.0.1", True)], port=backend.port, namespace=namespace, service=name
        )
    )
    return write_manifests(folder, f"{namespace}-{name}", *docs)


def aggregation_of(gateway: Gateway) -> OpenAPIAggregation:
    return gateway.control.openapi


def fast(
    gateway: Gateway, *, interval: float = 60.0, backoff: float = 0.05, backoff_max: float = 0.4
) -> OpenAPIAggregation:
    """Short backoff (and optionally refresh interval) for the gateway's OpenAPI refreshes, applied now."""
    aggregation = aggregation_of(gateway)
    refresher = aggregation.refresher
    refresher.interval, refresher.backoff_initial, refresher.backoff_max = interval, backoff, backoff_max
    aggregation.debounce = 0.0
    for key in refresher.tracked():
        refresher.poke(key)
    return aggregation


