"""OpenAPI documents of the sample server: v3 per group-version and a v2 document.

Built once at start-up in kube-apiserver's layout (kube-openapi builder): schemas with
`x-kubernetes-group-version-kind` and field descriptions (`kubectl explain`), the standard meta/v1
definitions they reference, and one operation per verb with inline query parameters. The PATCH
operations list `fieldValidation`, which is how kubectl decides to validate on the server
(`queryParamVerifierV3`) instead of downloading schemas to validate on the client.
"""

from __future__ import annotations

import copy
import hashlib
from importlib import resources as package_files
from typing import Any

import yaml

from aggregator.model.jsonenc import go_marshal
from aggregator.sample.api import GROUP, VERSIONS, ResourceType, resources_in
from aggregator.sample.openapi_pb import encode_document

JSON = dict[str, Any]

TITLE = "Wardle"
INFO_VERSION = "0.1"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"


def _load_meta() -> JSON:
    text = package_files.files("aggregator.openapi").joinpath("meta-v1.yaml").read_text()
    data: JSON = yaml.safe_load(text)
    return data


def _definition_prefix(version: str) -> str:
    """`com.example.wardle.v1beta1.`: kube-openapi's friendly name (reversed group) for our kinds."""
    return ".".join(reversed(GROUP.split("."))) + f".{version}."


def _camel_group() -> str:
    return "".join(part[:1].upper() + part[1:] for part in GROUP.split("."))


class _Schemas:
    """Schemas in v3 form, with `$ref` given as bare definition names until rendered."""

    def __init__(self, meta: JSON) -> None:
        self.meta = meta
        self.fields: dict[str, str] = meta["fields"]

    def ref(self, name: str, description: str | None = None, *, default: Any = None) -> JSON:
        out: JSON = {"allOf": [{"$ref": name}]}
        if default is not None:
            out["default"] = default
        if description is not None:
            out["description"] = description
        return out

    def string(self, description: str) -> JSON:
        return {"description": description, "type": "string"}

    def standard(self, list_meta: bool = False) -> JSON:
        return {
            "apiVersion": self.string(self.fields["apiVersion"]),
            "kind": self.string(self.fields["kind"]),
            "metadata": self.ref(
                META + ("ListMeta" if list_meta else "ObjectMeta"),
                self.fields["listMetadata" if list_meta else "metadata"],
                default={},
            ),
        }

    def gvk(self, kind: str, version: str) -> list[JSON]:
        return [{"group": GROUP, "kind": kind, "version": version}]

    def kind_schemas(self, resource: ResourceType, version: str) -> JSON:
        p = _definition_prefix(version)
        kind = resource.kind
        out: JSON = {}
        if kind == "Flunder":
            props = self.standard()
            props["spec"] = self.ref(
                p + "FlunderSpec", "spec is the desired state of the Flunder.", default={}
            )
            props["status"] = self.ref(
                p + "FlunderStatus",
                "status is the observed state of the Flunder; it has no fields yet.",
                default={},
            )
            out[p + "Flunder"] = {
                "description": "Flunder is an example type with a spec and a status.",
                "properties": dict(sorted(props.items())),
                "type": "object",
                "x-kubernetes-group-version-kind": self.gvk(kind, version),
            }
            if version == "v1alpha1":
                spec_props = {
                    "reference": self.string(
                        "A name of another flunder or fischer, depending on the reference type."
                    ),
                    "referenceType": self.string(
                        'The reference type, defaults to "Flunder" if reference is set. One of Flunder or Fischer.'
                    ),
                }
            else:
                spec_props = {
                    "fischerReference": self.string(
                        "A name of a fischer, mutually exclusive to the FlunderReference."
                    ),
                    "flunderReference": self.string(
                        "A name of another flunder, mutually exclusive to the FischerReference."
                    ),
                    "referenceType": self.string("The reference type: Flunder or Fischer."),
                }
            out[p + "FlunderSpec"] = {
                "description": "FlunderSpec is the specification of a Flunder.",
                "properties": spec_props,
                "type": "object",
            }
            out[p + "FlunderStatus"] = {
                "description": "FlunderStatus is the status of a Flunder.",
                "type": "object",
            }
        else:
            props = self.standard()
            props["disallowedFlunders"] = {
                "description": "DisallowedFlunders holds a list of Flunder.Names that are disallowed.",
                "items": {"default": "", "type": "string"},
                "type": "array",
                "x-kubernetes-list-type": "atomic",
            }
            out[p + "Fischer"] = {
                "description": "Fischer is a cluster-scoped example type: while it exists, flunders named in "
                "disallowedFlunders cannot be created.",
                "properties": dict(sorted(props.items())),
                "type": "object",
                "x-kubernetes-group-version-kind": self.gvk(kind, version),
            }
        list_props = self.standard(list_meta=True)
        list_props["items"] = {
            "description": f"items is the list of {kind} objects.",
            "items": {**self.ref(p + kind), "default": {}},
            "type": "array",
        }
        out[p + resource.list_kind] = {
            "description": f"{resource.list_kind} is a list of {kind} objects.",
            "properties": dict(sorted(list_props.items())),
            "required": ["items"],
            "type": "object",
            "x-kubernetes-group-version-kind": self.gvk(resource.list_kind, version),
        }
        return out

    def meta_schemas(self, versions: tuple[str, ...]) -> JSON:
        group_versions = [{"group": "", "kind": "", "version": "v1"}] + [
            {"group": GROUP, "kind": "", "version": v} for v in sorted(versions)
        ]
        out: JSON = {}
        for name, schema in self.meta["schemas"].items():
            schema = copy.deepcopy(schema)
            if schema.get("x-kubernetes-group-version-kind") == "$group-versions":
                kind = name.rsplit(".", 1)[1]
                schema["x-kubernetes-group-version-kind"] = [{**gv, "kind": kind} for gv in group_versions]
            for key, prop in list(schema.get("properties", {}).items()):
                if prop == {"$apiVersion": True}:
                    schema["properties"][key] = self.string(self.fields["apiVersion"])
                elif prop == {"$kind": True}:
                    schema["properties"][key] = self.string(self.fields["kind"])
            out[name] = schema
        return out


def _resolve_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        return {k: (prefix + v if k == "$ref" else _resolve_refs(v, prefix)) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_refs(v, prefix) for v in node]
    return node


# --- operations ------------------------------------------------------------------------------------

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


class _Operation:
    """One operation in a neutral form, rendered to either OpenAPI version."""

    def __init__(
        self,
        method: str,
        action: str,
        operation_id: str,
        description: str,
        kind: str,
        version: str,
        *,
        params: tuple[str, ...] = (),
        body: str | None = None,
        body_types: tuple[str, ...] = ("*/*",),
        body_required: bool = True,
        responses: tuple[str, ...] = ("200",),
        response: str,
        produces: tuple[str, ...] = PRODUCES,
    ) -> None:
        self.method = method
        self.action = action
        self.operation_id = operation_id
        self.description = description
        self.kind = kind
        self.version = version
        self.params = params
        self.body = body
        self.body_types = body_types
        self.body_required = body_required
        self.responses = responses
        self.response = response
        self.produces = produces


_STATUS_TEXT = {"200": "OK", "201": "Created", "202": "Accepted", "401": "Unauthorized"}


class _Path:
    def __init__(self, path: str, params: tuple[str, ...], operations: list[_Operation]) -> None:
        self.path = path
        self.params = params  # path-level: path parameters plus pretty (and list params for watch paths)
        self.operations = operations


def _paths_for(resource: ResourceType, version: str) -> list[_Path]:
    p = _definition_prefix(version)
    kind, plural = resource.kind, resource.plural
    obj, lst = p + kind, p + resource.list_kind
    status, delete_options, watch_event = META + "Status", META + "DeleteOptions", META + "WatchEvent"
    prefix = f"/apis/{GROUP}/{version}"
    ns = "Namespaced" if resource.namespaced else ""
    vv = _camel_group() + version[:1].upper() + version[1:]
    scope_path = "/namespaces/{namespace}" if resource.namespaced else ""
    scope_params: tuple[str, ...] = ("namespace",) if resource.namespaced else ()

    def op(method: str, action: str, verb_id: str, description: str, **kw: Any) -> _Operation:
        return _Operation(method, action, verb_id, description, kind, version, **kw)

    collection = [
        op(
            "delete",
            "deletecollection",
            f"delete{vv}Collection{ns}{kind}",
            f"delete collection of {kind}",
            params=DELETECOLLECTION_PARAMS,
            body=delete_options,
            body_required=False,
            response=status,
        ),
        op(
            "get",
            "list",
            f"list{vv}{ns}{kind}",
            f"list or watch objects of kind {kind}",
            params=LIST_PARAMS,
            response=lst,
            produces=PRODUCES_STREAM,
        ),
        op(
            "post",
            "post",
            f"create{vv}{ns}{kind}",
            f"create a {kind}",
            params=WRITE_PARAMS,
            body=obj,
            responses=("200", "201", "202"),
            response=obj,
        ),
    ]
    item = [
        op(
            "delete",
            "delete",
            f"delete{vv}{ns}{kind}",
            f"delete a {kind}",
            params=DELETE_PARAMS,
            body=delete_options,
            body_required=False,
            responses=("200", "202"),
            response=status,
        ),
        op("get", "get", f"read{vv}{ns}{kind}", f"read the specified {kind}", response=obj),
        op(
            "patch",
            "patch",
            f"patch{vv}{ns}{kind}",
            f"partially update the specified {kind}",
            params=PATCH_PARAMS,
            body=META + "Patch",
            body_types=PATCH_TYPES,
            responses=("200", "201"),
            response=obj,
        ),
        op(
            "put",
            "put",
            f"replace{vv}{ns}{kind}",
            f"replace the specified {kind}",
            params=WRITE_PARAMS,
            body=obj,
            responses=("200", "201"),
            response=obj,
        ),
    ]
    watch_list_params = tuple(x for x in LIST_PARAMS if x != "watch")
    paths = [
        _Path(f"{prefix}{scope_path}/{plural}", (*scope_params, "pretty"), collection),
        _Path(f"{prefix}{scope_path}/{plural}/{{name}}", ("name", *scope_params, "pretty"), item),
        _Path(
            f"{prefix}/watch{scope_path}/{plural}",
            (*watch_list_params, *scope_params, "pretty", "watch"),
            [
                op(
                    "get",
                    "watchlist",
                    f"watch{vv}{ns}{kind}List",
                    f"watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter "
                    "with a list operation instead.",
                    response=watch_event,
                    produces=PRODUCES_STREAM,
                )
            ],
        ),
        _Path(
            f"{prefix}/watch{scope_path}/{plural}/{{name}}",
            (*watch_list_params, "name", *scope_params, "pretty", "watch"),
            [
                op(
                    "get",
                    "watch",
                    f"watch{vv}{ns}{kind}",
                    f"watch changes to an object of kind {kind}. deprecated: use the 'watch' parameter with "
                    "a list operation instead, filtered to a single item with the 'fieldSelector' parameter.",
                    response=watch_event,
                    produces=PRODUCES_STREAM,
                )
            ],
        ),
    ]
    if resource.namespaced:
        paths.append(
            _Path(
                f"{prefix}/{plural}",
                (*LIST_PARAMS[:5], "pretty", *LIST_PARAMS[5:]),
                [
                    op(
                        "get",
                        "list",
                        f"list{vv}{kind}ForAllNamespaces",
                        f"list or watch objects of kind {kind}",
                        response=lst,
                        produces=PRODUCES_STREAM,
                    )
                ],
            )
        )
        paths.append(
            _Path(
                f"{prefix}/watch/{plural}",
                (*LIST_PARAMS[:5], "pretty", *LIST_PARAMS[5:]),
                [
                    op(
                        "get",
                        "watchlist",
                        f"watch{vv}{kind}ListForAllNamespaces",
                        f"watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter "
                        "with a list operation instead.",
                        response=watch_event,
                        produces=PRODUCES_STREAM,
                    )
                ],
            )
        )
    return paths


def _resources_path(version: str) -> _Path:
    vv = _camel_group() + version[:1].upper() + version[1:]
    return _Path(
        f"/apis/{GROUP}/{version}/",
        (),
        [
            _Operation(
                "get",
                "",
                f"get{vv}APIResources",
                "get available resources",
                "",
                version,
                response=META + "APIResourceList",
            )
        ],
    )


def _tag(version: str) -> str:
    camel = _camel_group()
    return f"{camel[:1].lower()}{camel[1:]}_{version}"


class _Renderer:
    def __init__(self, meta: JSON) -> None:
        self.param_docs: dict[str, list[str]] = meta["parameters"]

    def param(self, name: str, *, v3: bool) -> JSON:
        if name == "name":
            type_, description = "string", "name of the object"  # _params names the kind
        else:
            type_, description = self.param_docs[name]
        wire = "fieldManager" if name == "fieldManagerPatch" else name
        location = "path" if name in ("name", "namespace") else "query"
        out: JSON = {"description": description, "in": location, "name": wire}
        if location == "path":
            out["required"] = True
        if v3:
            out["schema"] = {"type": type_, "uniqueItems": True}
        else:
            out["type"] = type_
            out["uniqueItems"] = True
        return out

    def _params(self, names: tuple[str, ...], kind: str, *, v3: bool) -> list[JSON]:
        params = [self.param(n, v3=v3) for n in names]
        for p in params:
            if p["name"] == "name":
                p["description"] = f"name of the {kind}"
        return params

    def v3_operation(self, op: _Operation) -> JSON:
        out: JSON = {"description": op.description, "operationId": op.operation_id}
        if op.params:
            out["parameters"] = self._params(op.params, op.kind, v3=True)
        if op.body:
            body: JSON = {"content": {t: {"schema": {"$ref": V3_REF + op.body}} for t in op.body_types}}
            if op.body_required:
                body["required"] = True
            out["requestBody"] = body
        responses: JSON = {}
        for code in op.responses:
            responses[code] = {
                "content": {t: {"schema": {"$ref": V3_REF + op.response}} for t in op.produces},
                "description": _STATUS_TEXT[code],
            }
        responses["401"] = {"description": "Unauthorized"}
        out["responses"] = responses
        out["tags"] = [_tag(op.version)]
        if op.action:
            out["x-kubernetes-action"] = op.action
            out["x-kubernetes-group-version-kind"] = {"group": GROUP, "kind": op.kind, "version": op.version}
        return out

    def v2_operation(self, op: _Operation) -> JSON:
        out: JSON = {"consumes": list(op.body_types) if op.body else ["*/*"]}
        out["description"] = op.description
        out["operationId"] = op.operation_id
        params = self._params(op.params, op.kind, v3=False)
        if op.body:
            body_param: JSON = {"in": "body", "name": "body", "schema": {"$ref": V2_REF + op.body}}
            if op.body_required:
                body_param["required"] = True
            params.insert(0, body_param)
        if params:
            out["parameters"] = params
        out["produces"] = list(op.produces)
        responses: JSON = {}
        for code in op.responses:
            responses[code] = {"description": _STATUS_TEXT[code], "schema": {"$ref": V2_REF + op.response}}
        responses["401"] = {"description": "Unauthorized"}
        out["responses"] = responses
        out["schemes"] = ["https"]
        out["tags"] = [_tag(op.version)]
        if op.action:
            out["x-kubernetes-action"] = op.action
            out["x-kubernetes-group-version-kind"] = {"group": GROUP, "kind": op.kind, "version": op.version}
        return out

    def v3_paths(self, paths: list[_Path]) -> JSON:
        out: JSON = {}
        for path in sorted(paths, key=lambda p: p.path):
            item: JSON = {op.method: self.v3_operation(op) for op in path.operations}
            if path.params:
                item["parameters"] = self._params(path.params, path.operations[0].kind, v3=True)
            out[path.path] = dict(sorted(item.items()))
        return out

    def v2_paths(self, paths: list[_Path]) -> JSON:
        out: JSON = {}
        for path in sorted(paths, key=lambda p: p.path):
            item: JSON = {op.method: self.v2_operation(op) for op in path.operations}
            if path.params:
                item["parameters"] = self._params(path.params, path.operations[0].kind, v3=False)
            out[path.path] = dict(sorted(item.items()))
        return out


def _v2_schema(node: Any) -> Any:
    """v3 component schema -> v2 definition: single-ref `allOf` becomes `$ref` (defaults dropped)."""
    if isinstance(node, list):
        return [_v2_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1 and "$ref" in node["allOf"][0]:
        out = {"$ref": node["allOf"][0]["$ref"]}
        for key, value in node.items():
            if key not in ("allOf", "default"):
                out[key] = _v2_schema(value)
        return dict(sorted(out.items()))
    return {k: _v2_schema(v) for k, v in node.items()}


def build_v3(version: str, meta: JSON | None = None) -> JSON:
    meta = meta if meta is not None else _load_meta()
    schemas = _Schemas(meta)
    renderer = _Renderer(meta)
    components: JSON = {}
    paths = [_resources_path(version)]
    for resource in resources_in(version):
        components.update(schemas.kind_schemas(resource, version))
        paths.extend(_paths_for(resource, version))
    components.update(schemas.meta_schemas((version,)))
    return {
        "openapi": "3.0.0",
        "info": {"title": TITLE, "version": INFO_VERSION},
        "paths": renderer.v3_paths(paths),
        "components": {
            "schemas": _resolve_refs(dict(sorted(components.items())), V3_REF),
            "securitySchemes": {
                "BearerToken": {
                    "description": "Bearer Token authentication",
                    "in": "header",
                    "name": "authorization",
                    "type": "apiKey",
                }
            },
        },
    }


def build_v2(meta: JSON | None = None) -> JSON:
    meta = meta if meta is not None else _load_meta()
    schemas = _Schemas(meta)
    renderer = _Renderer(meta)
    definitions: JSON = {}
    paths: list[_Path] = []
    for version in VERSIONS:
        paths.append(_resources_path(version))
        for resource in resources_in(version):
            definitions.update(schemas.kind_schemas(resource, version))
            paths.extend(_paths_for(resource, version))
    definitions.update(schemas.meta_schemas(VERSIONS))
    v2_definitions = _v2_schema(_resolve_refs(dict(sorted(definitions.items())), V2_REF))
    return {
        "swagger": "2.0",
        "info": {"title": TITLE, "version": INFO_VERSION},
        "paths": renderer.v2_paths(paths),
        "definitions": v2_definitions,
        "securityDefinitions": {
            "BearerToken": {
                "description": "Bearer Token authentication",
                "in": "header",
                "name": "authorization",
                "type": "apiKey",
            }
        },
        "security": [{"BearerToken": []}],
    }


def etag_of(data: bytes) -> str:
    """kube-openapi's ETag: uppercase hex SHA-512 of the served bytes."""
    return hashlib.sha512(data).hexdigest().upper()


class OpenAPIDocuments:
    """Rendered bytes and ETags: `/openapi/v3` index, one document per group-version, `/openapi/v2`."""

    def __init__(self) -> None:
        meta = _load_meta()
        self.v3: dict[str, bytes] = {}
        self.v3_etags: dict[str, str] = {}
        for version in VERSIONS:
            path = f"apis/{GROUP}/{version}"
            data = go_marshal(build_v3(version, meta))
            self.v3[path] = data
            self.v3_etags[path] = etag_of(data)
        self.index = go_marshal(
            {
                "paths": {
                    path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={etag}"}
                    for path, etag in sorted(self.v3_etags.items())
                }
            }
        )
        v2 = build_v2(meta)
        self.v2 = go_marshal(v2)
        self.v2_etag = etag_of(self.v2)
        self.v2_protobuf = encode_document(v2)
        self.v2_protobuf_etag = etag_of(self.v2_protobuf)
