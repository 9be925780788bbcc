"""OpenAPI for what local mode serves itself: `apiregistration.k8s.io/v1` (APIServices).

In kube mode kube-apiserver publishes this group-version; a local-mode gateway serves it on its
own (`aggregator/apiregistration.py`), so it publishes its documents too, or `kubectl explain
apiservices` has nothing to read. Built once, in kube-apiserver's layout (kube-openapi's
builder): the APIService schemas with upstream's field descriptions (`apiregistration-v1.yaml`),
the meta/v1 schemas they reference, and one operation per verb of the resource and its `status`
subresource with upstream's operation ids and query parameters. Responses list the media types
the gateway serves (JSON, YAML, JSON watch streams). The v3 document is `/openapi/v3/apis/
apiregistration.k8s.io/v1`; the v2 form heads the merged `/openapi/v2`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import resources as package_files
from typing import Any

import yaml

from aggregator import __version__

JSON = dict[str, Any]

GROUP = "apiregistration.k8s.io"
VERSION = "v1"
KEY = f"apis/{GROUP}/{VERSION}"  # the `/openapi/v3` key
PREFIX = f"/{KEY}"
KIND = "APIService"
LIST_KIND = "APIServiceList"
PLURAL = "apiservices"
TYPES = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"
# kube-openapi's operation-id prefix and tag for the group-version (`.k8s.io` dropped).
OPERATION_PREFIX = "ApiregistrationV1"
TAG = "apiregistration_v1"

LIST_PARAMS = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
)
DELETECOLLECTION_PARAMS = (
    "continue",
    "dryRun",
    "fieldSelector",
    "gracePeriodSeconds",
    "labelSelector",
    "limit",
    "orphanDependents",
    "propagationPolicy",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
)
WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
PATCH_PARAMS = ("dryRun", "fieldManagerPatch", "fieldValidation", "force")
DELETE_PARAMS = ("dryRun", "gracePeriodSeconds", "orphanDependents", "propagationPolicy")
PATCH_TYPES = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)
PRODUCES = ("application/json", "application/yaml")
PRODUCES_STREAM = ("application/json", "application/json;stream=watch", "application/yaml")
STATUS_TEXT = {"200": "OK", "201": "Created", "202": "Accepted"}
SECURITY_SCHEME = {
    "description": "Bearer Token authentication",
    "in": "header",
    "name": "authorization",
    "type": "apiKey",
}


def _load(package: str, name: str) -> JSON:
    data: JSON = yaml.safe_load(package_files.files(package).joinpath(name).read_text())
    return data


@dataclass(frozen=True)
class _Op:
    """One operation, rendered to either OpenAPI version."""

    method: str
    action: str  # x-kubernetes-action ("" for the resource list)
    operation_id: str
    description: str
    response: str
    params: tuple[str, ...] = ()
    body: str | None = None
    body_required: bool = True
    body_types: tuple[str, ...] = ("*/*",)
    codes: tuple[str, ...] = ("200",)
    produces: tuple[str, ...] = PRODUCES


@dataclass(frozen=True)
class _Path:
    path: str
    params: tuple[str, ...]  # path-level: path parameters, pretty, the watch paths' list options
    operations: tuple[_Op, ...]


def _paths() -> list[_Path]:
    obj, lst = TYPES + KIND, TYPES + LIST_KIND
    status, delete_options, watch_event = META + "Status", META + "DeleteOptions", META + "WatchEvent"
    p = OPERATION_PREFIX
    item_ops = (
        _Op(
            "delete",
            "delete",
            f"delete{p}{KIND}",
            f"delete an {KIND}",
            status,
            DELETE_PARAMS,
            delete_options,
            False,
            codes=("200", "202"),
        ),
        _Op("get", "get", f"read{p}{KIND}", f"read the specified {KIND}", obj),
        _Op(
            "patch",
            "patch",
            f"patch{p}{KIND}",
            f"partially update the specified {KIND}",
            obj,
            PATCH_PARAMS,
            META + "Patch",
            body_types=PATCH_TYPES,
            codes=("200", "201"),
        ),
        _Op(
            "put",
            "put",
            f"replace{p}{KIND}",
            f"replace the specified {KIND}",
            obj,
            WRITE_PARAMS,
            obj,
            codes=("200", "201"),
        ),
    )
    status_ops = (
        _Op("get", "get", f"read{p}{KIND}Status", f"read status of the specified {KIND}", obj),
        _Op(
            "patch",
            "patch",
            f"patch{p}{KIND}Status",
            f"partially update status of the specified {KIND}",
            obj,
            PATCH_PARAMS,
            META + "Patch",
            body_types=PATCH_TYPES,
            codes=("200", "201"),
        ),
        _Op(
            "put",
            "put",
            f"replace{p}{KIND}Status",
            f"replace status of the specified {KIND}",
            obj,
            WRITE_PARAMS,
            obj,
            codes=("200", "201"),
        ),
    )
    collection_ops = (
        _Op(
            "delete",
            "deletecollection",
            f"delete{p}Collection{KIND}",
            f"delete collection of {KIND}",
            status,
            DELETECOLLECTION_PARAMS,
            delete_options,
            False,
        ),
        _Op(
            "get",
            "list",
            f"list{p}{KIND}",
            f"list or watch objects of kind {KIND}",
            lst,
            LIST_PARAMS,
            produces=PRODUCES_STREAM,
        ),
        _Op(
            "post",
            "post",
            f"create{p}{KIND}",
            f"create an {KIND}",
            obj,
            WRITE_PARAMS,
            obj,
            codes=("200", "201", "202"),
        ),
    )
    watch_params = tuple(sorted((*LIST_PARAMS, "pretty")))
    return [
        _Path(
            f"{PREFIX}/",
            (),
            (_Op("get", "", f"get{p}APIResources", "get available resources", META + "APIResourceList"),),
        ),
        _Path(f"{PREFIX}/{PLURAL}", ("pretty",), collection_ops),
        _Path(f"{PREFIX}/{PLURAL}/{{name}}", ("name", "pretty"), item_ops),
        _Path(f"{PREFIX}/{PLURAL}/{{name}}/status", ("name", "pretty"), status_ops),
        _Path(
            f"{PREFIX}/watch/{PLURAL}",
            watch_params,
            (
                _Op(
                    "get",
                    "watchlist",
                    f"watch{p}{KIND}List",
                    f"watch individual changes to a list of {KIND}. deprecated: use the 'watch' parameter "
                    "with a list operation instead.",
                    watch_event,
                    produces=PRODUCES_STREAM,
                ),
            ),
        ),
        _Path(
            f"{PREFIX}/watch/{PLURAL}/{{name}}",
            tuple(sorted((*watch_params, "name"))),
            (
                _Op(
                    "get",
                    "watch",
                    f"watch{p}{KIND}",
                    f"watch changes to an object of kind {KIND}. deprecated: use the 'watch' parameter with a "
                    "list operation instead, filtered to a single item with the 'fieldSelector' parameter.",
                    watch_event,
                    produces=PRODUCES_STREAM,
                ),
            ),
        ),
    ]


class _Renderer:
    def __init__(self, parameters: dict[str, list[str]]) -> None:
        self.parameters = parameters

    def param(self, name: str, *, v3: bool) -> JSON:
        if name == "name":
            type_, description = "string", f"name of the {KIND}"
        else:
            type_, description = self.parameters[name]
        location = "path" if name == "name" else "query"
        wire = "fieldManager" if name == "fieldManagerPatch" else name
        out: JSON = {"description": description, "in": location, "name": wire}
        if location == "path":
            out["required"] = True
        if v3:
            out["schema"] = {"type": type_, "uniqueItems": True}
        else:
            out["type"] = type_
            out["uniqueItems"] = True
        return out

    def operation(self, op: _Op, *, v3: bool) -> JSON:
        ref = V3_REF if v3 else V2_REF
        out: JSON = {}
        if not v3:
            out["consumes"] = list(op.body_types) if op.body else ["*/*"]
        out["description"] = op.description
        out["operationId"] = op.operation_id
        params = [self.param(n, v3=v3) for n in op.params]
        if op.body and not v3:
            body: JSON = {"in": "body", "name": "body", "schema": {"$ref": ref + op.body}}
            if op.body_required:
                body["required"] = True
            params.insert(0, body)
        if params:
            out["parameters"] = params
        if op.body and v3:
            request: JSON = {"content": {t: {"schema": {"$ref": ref + op.body}} for t in op.body_types}}
            if op.body_required:
                request["required"] = True
            out["requestBody"] = request
        if not v3:
            out["produces"] = list(op.produces)
        responses: JSON = {}
        for code in op.codes:
            if v3:
                content = {t: {"schema": {"$ref": ref + op.response}} for t in op.produces}
                responses[code] = {"content": content, "description": STATUS_TEXT[code]}
            else:
                responses[code] = {"description": STATUS_TEXT[code], "schema": {"$ref": ref + op.response}}
        responses["401"] = {"description": "Unauthorized"}
        out["responses"] = responses
        if not v3:
            out["schemes"] = ["https"]
        out["tags"] = [TAG]
        if op.action:
            out["x-kubernetes-action"] = op.action
            out["x-kubernetes-group-version-kind"] = {"group": GROUP, "kind": KIND, "version": VERSION}
        return out

    def paths(self, *, v3: bool) -> JSON:
        out: JSON = {}
        for path in _paths():
            item: JSON = {op.method: self.operation(op, v3=v3) for op in path.operations}
            if path.params:
                item["parameters"] = [self.param(n, v3=v3) for n in path.params]
            out[path.path] = dict(sorted(item.items()))
        return dict(sorted(out.items()))


def _schemas(meta: JSON, types: JSON) -> JSON:
    """Every schema, v3 form, `$ref`s still bare names, markers replaced."""
    fields: dict[str, str] = meta["fields"]
    gvks = [{"group": "", "kind": "", "version": "v1"}, {"group": GROUP, "kind": "", "version": VERSION}]
    out: JSON = {}
    for name, schema in {**meta["schemas"], **types["schemas"]}.items():
        schema = copy.deepcopy(schema)
        if schema.get("x-kubernetes-group-version-kind") == "$group-versions":
            kind = name.rsplit(".", 1)[1]
            schema["x-kubernetes-group-version-kind"] = [{**gv, "kind": kind} for gv in gvks]
        for key, prop in list(schema.get("properties", {}).items()):
            if prop == {"$apiVersion": True}:
                schema["properties"][key] = {"description": fields["apiVersion"], "type": "string"}
            elif prop == {"$kind": True}:
                schema["properties"][key] = {"description": fields["kind"], "type": "string"}
        out[name] = schema
    return dict(sorted(out.items()))


def _resolve(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        return {k: (prefix + v if k == "$ref" else _resolve(v, prefix)) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, prefix) for v in node]
    return node


def _v2_schema(node: Any) -> Any:
    """v3 schema -> v2 definition: a single-`$ref` `allOf` becomes the `$ref` (its default dropped)."""
    if isinstance(node, list):
        return [_v2_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        out = {"$ref": all_of[0]["$ref"]}
        out.update((k, _v2_schema(v)) for k, v in node.items() if k not in ("allOf", "default"))
        return dict(sorted(out.items()))
    return {k: _v2_schema(v) for k, v in node.items()}


def build_documents() -> tuple[JSON, JSON]:
    """(the v3 document of apiregistration.k8s.io/v1, a v2 document with its paths and definitions)."""
    meta = _load("aggregator.openapi", "meta-v1.yaml")
    types = _load("aggregator.openapi", "apiregistration-v1.yaml")
    schemas = _schemas(meta, types)
    renderer = _Renderer(meta["parameters"])
    info = {"title": "Kubernetes", "version": f"v{__version__}"}
    v3 = {
        "openapi": "3.0.0",
        "info": info,
        "paths": renderer.paths(v3=True),
        "components": {
            "schemas": _resolve(schemas, V3_REF),
            "securitySchemes": {"BearerToken": dict(SECURITY_SCHEME)},
        },
    }
    v2 = {
        "swagger": "2.0",
        "info": dict(info),
        "paths": renderer.paths(v3=False),
        "definitions": _v2_schema(_resolve(schemas, V2_REF)),
        "securityDefinitions": {"BearerToken": dict(SECURITY_SCHEME)},
        "security": [{"BearerToken": []}],
    }
    return v3, v2
