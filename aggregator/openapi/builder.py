"""kube-apiserver's OpenAPI layout for resources described in a few fields (kube-openapi's builder).

kube-apiserver's installer registers one route per verb of each resource and kube-openapi's
builder turns the routes into paths and operations. Two documents here are built in that layout
without the routes: the gateway's own `apiregistration.k8s.io/v1` (local mode, `local.py`) and the
sample server's `wardle.example.com` (`samples/wardle/sample_apiserver/openapi.py`). A `Resource` names what the
installer derives a resource's routes from; `resource_paths` and `group_version_path` lay them out,
with upstream's operation ids, tags, descriptions and query parameters (`meta-v1.yaml`, which also
holds the meta/v1 schemas the operations reference). Schemas are written in v3 form with bare
definition names as `$ref`s: `Spec.v3` resolves them, `Spec.v2` resolves and converts them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources as package_files
from typing import Any

import yaml

JSON = dict[str, Any]

META = "io.k8s.apimachinery.pkg.apis.meta.v1."
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"

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
# `fieldManagerPatch` is `fieldManager` with the description PATCH documents it with.
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
WATCHLIST_DOC = (
    "watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list "
    "operation instead."
)
WATCH_DOC = (
    "watch changes to an object of kind {kind}. deprecated: use the 'watch' parameter with a list "
    "operation instead, filtered to a single item with the 'fieldSelector' parameter."
)


def load_meta() -> JSON:
    """`meta-v1.yaml`: meta/v1 `schemas`, the standard `fields`' descriptions, query `parameters`."""
    text = package_files.files("aggregator.openapi").joinpath("meta-v1.yaml").read_text()
    data: JSON = yaml.safe_load(text)
    return data


# --- names ------------------------------------------------------------------------------------------


def _valid_operation_id(text: str, capitalize_first: bool) -> str:
    """apiserver's `ToValidOperationID`: drop punctuation, capitalise what follows it."""
    out: list[str] = []
    capitalize = capitalize_first
    for i, char in enumerate(text):
        if char.isalpha() or char == "_" or (i != 0 and char.isdigit()):
            out.append(char.upper() if capitalize else char)
            capitalize = False
        else:
            capitalize = True
    return "".join(out)


def operation_id_prefix(group: str, version: str) -> str:
    """`GetOperationIDAndTags`: `ApiregistrationV1`, `WardleExampleComV1beta1` (`.k8s.io` dropped)."""
    return _valid_operation_id(group.removesuffix(".k8s.io"), True) + _valid_operation_id(version, True)


def operation_tag(group: str, version: str) -> str:
    """`GetOperationIDAndTags`: `apiregistration_v1`, `wardleExampleCom_v1beta1`."""
    return (
        f"{_valid_operation_id(group.removesuffix('.k8s.io'), False)}_{_valid_operation_id(version, False)}"
    )


def article(noun: str) -> str:
    """The installer's `GetArticleForNoun(noun, " ")`: " an " (APIService), " a " (Flunder), " " (plurals)."""
    if noun.endswith("s") and not noun.endswith("ss"):
        return " "
    return " an " if noun[:1].lower() in "aeiou" else " a "


# --- paths and operations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """What kube-apiserver's installer derives a resource's routes from."""

    group: str
    version: str
    kind: str
    plural: str
    schema_prefix: str  # definition names of the kind and its list: prefix + kind, prefix + list kind
    namespaced: bool = False
    # Subresources served with the kind itself (get, patch, put), e.g. "status".
    subresources: tuple[str, ...] = ()
    # The watch paths' parameters: sorted by name (kube-openapi), or list options, path parameters,
    # pretty, watch (the order the sample server has always published).
    watch_params_sorted: bool = True

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


@dataclass(frozen=True)
class Operation:
    """One operation, rendered to either OpenAPI version."""

    method: str
    action: str  # x-kubernetes-action; "" (with no GVK) for the group-version's resource list
    operation_id: str
    description: str
    response: str  # schema name
    params: tuple[str, ...] = ()
    body: str | None = None  # schema name
    body_required: bool = True
    body_types: tuple[str, ...] = ("*/*",)
    codes: tuple[str, ...] = ("200",)
    produces: tuple[str, ...] = PRODUCES


@dataclass(frozen=True)
class Path:
    path: str
    group: str
    version: str
    kind: str  # the operations' GVK kind; names the `name` parameter
    params: tuple[str, ...]  # path-level: path parameters, pretty, the watch paths' list options
    operations: tuple[Operation, ...]


def group_version_path(group: str, version: str) -> Path:
    """`/apis/<group>/<version>/`: the group-version's APIResourceList."""
    prefix = operation_id_prefix(group, version)
    get = Operation(
        "get", "", f"get{prefix}APIResources", "get available resources", META + "APIResourceList"
    )
    return Path(f"/apis/{group}/{version}/", group, version, "", (), (get,))


def resource_paths(resource: Resource) -> list[Path]:
    """The paths kube-apiserver installs for a resource with every standard verb."""
    r = resource
    kind, p = r.kind, operation_id_prefix(r.group, r.version)
    ns = "Namespaced" if r.namespaced else ""
    obj, lst = r.schema_prefix + kind, r.schema_prefix + r.list_kind
    status, delete_options, watch_event = META + "Status", META + "DeleteOptions", META + "WatchEvent"
    scope: tuple[str, ...] = ("namespace",) if r.namespaced else ()
    base = f"/apis/{r.group}/{r.version}"
    in_namespace = "/namespaces/{namespace}" if r.namespaced else ""
    all_namespaces = tuple(sorted((*LIST_PARAMS, "pretty")))

    def path(url: str, params: tuple[str, ...], *operations: Operation) -> Path:
        return Path(url, r.group, r.version, kind, params, operations)

    def watch_params(path_params: tuple[str, ...]) -> tuple[str, ...]:
        if r.watch_params_sorted:
            return tuple(sorted((*LIST_PARAMS, *path_params, "pretty")))
        return (*(n for n in LIST_PARAMS if n != "watch"), *path_params, "pretty", "watch")

    def read_write(what: str, suffix: str) -> tuple[Operation, ...]:
        """get, patch and put of the object (or of a subresource served with its kind)."""
        return (
            Operation("get", "get", f"read{p}{ns}{kind}{suffix}", f"read {what}", obj),
            Operation(
                "patch",
                "patch",
                f"patch{p}{ns}{kind}{suffix}",
                f"partially update {what}",
                obj,
                PATCH_PARAMS,
                META + "Patch",
                body_types=PATCH_TYPES,
                codes=("200", "201"),
            ),
            Operation(
                "put",
                "put",
                f"replace{p}{ns}{kind}{suffix}",
                f"replace {what}",
                obj,
                WRITE_PARAMS,
                obj,
                codes=("200", "201"),
            ),
        )

    watchlist = Operation(
        "get",
        "watchlist",
        f"watch{p}{ns}{kind}List",
        WATCHLIST_DOC.format(kind=kind),
        watch_event,
        produces=PRODUCES_STREAM,
    )
    paths = [
        path(
            f"{base}{in_namespace}/{r.plural}",
            (*scope, "pretty"),
            Operation(
                "delete",
                "deletecollection",
                f"delete{p}Collection{ns}{kind}",
                f"delete collection of {kind}",
                status,
                DELETECOLLECTION_PARAMS,
                delete_options,
                body_required=False,
            ),
            Operation(
                "get",
                "list",
                f"list{p}{ns}{kind}",
                f"list or watch objects of kind {kind}",
                lst,
                LIST_PARAMS,
                produces=PRODUCES_STREAM,
            ),
            Operation(
                "post",
                "post",
                f"create{p}{ns}{kind}",
                f"create{article(kind)}{kind}",
                obj,
                WRITE_PARAMS,
                obj,
                codes=("200", "201", "202"),
            ),
        ),
        path(
            f"{base}{in_namespace}/{r.plural}/{{name}}",
            ("name", *scope, "pretty"),
            Operation(
                "delete",
                "delete",
                f"delete{p}{ns}{kind}",
                f"delete{article(kind)}{kind}",
                status,
                DELETE_PARAMS,
                delete_options,
                body_required=False,
                codes=("200", "202"),
            ),
            *read_write(f"the specified {kind}", ""),
        ),
        *(
            path(
                f"{base}{in_namespace}/{r.plural}/{{name}}/{sub}",
                ("name", *scope, "pretty"),
                *read_write(f"{sub} of the specified {kind}", sub[:1].upper() + sub[1:]),
            )
            for sub in r.subresources
        ),
        path(f"{base}/watch{in_namespace}/{r.plural}", watch_params(scope), watchlist),
        path(
            f"{base}/watch{in_namespace}/{r.plural}/{{name}}",
            watch_params(("name", *scope)),
            Operation(
                "get",
                "watch",
                f"watch{p}{ns}{kind}",
                WATCH_DOC.format(kind=kind),
                watch_event,
                produces=PRODUCES_STREAM,
            ),
        ),
    ]
    if r.namespaced:
        paths += [
            path(
                f"{base}/{r.plural}",
                all_namespaces,
                Operation(
                    "get",
                    "list",
                    f"list{p}{kind}ForAllNamespaces",
                    f"list or watch objects of kind {kind}",
                    lst,
                    produces=PRODUCES_STREAM,
                ),
            ),
            path(
                f"{base}/watch/{r.plural}",
                all_namespaces,
                Operation(
                    "get",
                    "watchlist",
                    f"watch{p}{kind}ListForAllNamespaces",
                    WATCHLIST_DOC.format(kind=kind),
                    watch_event,
                    produces=PRODUCES_STREAM,
                ),
            ),
        ]
    return paths


class _Renderer:
    """Paths as one OpenAPI version writes them, keys in kube-openapi's (sorted) order."""

    def __init__(self, parameters: Mapping[str, Sequence[str]], *, v3: bool) -> None:
        self.parameters = parameters  # name -> (type, description)
        self.v3 = v3
        self.ref = V3_REF if v3 else V2_REF

    def param(self, name: str, kind: str) -> JSON:
        type_, description = ("string", f"name of the {kind}") if name == "name" else self.parameters[name]
        location = "path" if name in ("name", "namespace") else "query"
        wire = "fieldManager" if name == "fieldManagerPatch" else name
        out: JSON = {"description": description, "in": location, "name": wire}
        if location == "path":
            out["required"] = True
        if self.v3:
            out["schema"] = {"type": type_, "uniqueItems": True}
        else:
            out["type"] = type_
            out["uniqueItems"] = True
        return out

    def _schema(self, name: str) -> JSON:
        return {"$ref": self.ref + name}

    def operation(self, op: Operation, path: Path) -> JSON:
        v3 = self.v3
        out: JSON = {}
        if not v3:
            out["consumes"] = list(op.body_types) if op.body else ["*/*"]
        out["description"] = op.description
        out["operationId"] = op.operation_id
        params = [self.param(n, path.kind) for n in op.params]
        if op.body and not v3:
            body: JSON = {"in": "body", "name": "body", "schema": self._schema(op.body)}
            if op.body_required:
                body["required"] = True
            params.insert(0, body)
        if params:
            out["parameters"] = params
        if op.body and v3:
            request: JSON = {"content": {t: {"schema": self._schema(op.body)} for t in op.body_types}}
            if op.body_required:
                request["required"] = True
            out["requestBody"] = request
        if not v3:
            out["produces"] = list(op.produces)
        responses: JSON = {}
        for code in op.codes:
            if v3:
                content = {t: {"schema": self._schema(op.response)} for t in op.produces}
                responses[code] = {"content": content, "description": STATUS_TEXT[code]}
            else:
                responses[code] = {"description": STATUS_TEXT[code], "schema": self._schema(op.response)}
        responses["401"] = {"description": "Unauthorized"}
        out["responses"] = responses
        if not v3:
            out["schemes"] = ["https"]
        out["tags"] = [operation_tag(path.group, path.version)]
        if op.action:
            out["x-kubernetes-action"] = op.action
            out["x-kubernetes-group-version-kind"] = {
                "group": path.group,
                "kind": path.kind,
                "version": path.version,
            }
        return out

    def paths(self, paths: Iterable[Path]) -> JSON:
        out: JSON = {}
        for path in sorted(paths, key=lambda p: p.path):
            item: JSON = {op.method: self.operation(op, path) for op in path.operations}
            if path.params:
                item["parameters"] = [self.param(n, path.kind) for n in path.params]
            out[path.path] = dict(sorted(item.items()))
        return out


# --- schemas and documents --------------------------------------------------------------------------


def expand_markers(
    schemas: Mapping[str, JSON], fields: Mapping[str, str], group: str, versions: Iterable[str]
) -> JSON:
    """The YAML's markers filled in: `$group-versions` (a meta kind is registered in core v1 and in
    every group-version served: `versions`), `{$apiVersion: true}` / `{$kind: true}` (the standard
    fields' descriptions)."""
    group_versions = [{"group": "", "kind": "", "version": "v1"}] + [
        {"group": group, "kind": "", "version": v} for v in sorted(versions)
    ]
    out: JSON = {}
    for name, schema in schemas.items():
        schema = copy.deepcopy(schema)
        if schema.get("x-kubernetes-group-version-kind") == "$group-versions":
            kind = name.rsplit(".", 1)[1]
            schema["x-kubernetes-group-version-kind"] = [{**gv, "kind": kind} for gv in group_versions]
        for key, prop in list(schema.get("properties", {}).items()):
            if prop == {"$apiVersion": True}:
                schema["properties"][key] = {"description": fields["apiVersion"], "type": "string"}
            elif prop == {"$kind": True}:
                schema["properties"][key] = {"description": fields["kind"], "type": "string"}
        out[name] = schema
    return out


def _resolve(node: Any, prefix: str) -> Any:
    """Bare `$ref` names -> references into the document (`prefix` + name)."""
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


@dataclass(frozen=True)
class Spec:
    """What one document holds, rendered as kube-apiserver serves it in either OpenAPI version."""

    info: JSON
    paths: Sequence[Path]
    schemas: Mapping[str, Any]  # v3 form, `$ref`s bare definition names
    parameters: Mapping[str, Sequence[str]]  # query parameter name -> (type, description)

    def _schemas(self, prefix: str) -> Any:
        return _resolve(dict(sorted(self.schemas.items())), prefix)

    def v3(self) -> JSON:
        return {
            "openapi": "3.0.0",
            "info": dict(self.info),
            "paths": _Renderer(self.parameters, v3=True).paths(self.paths),
            "components": {
                "schemas": self._schemas(V3_REF),
                "securitySchemes": {"BearerToken": dict(SECURITY_SCHEME)},
            },
        }

    def v2(self) -> JSON:
        return {
            "swagger": "2.0",
            "info": dict(self.info),
            "paths": _Renderer(self.parameters, v3=False).paths(self.paths),
            "definitions": _v2_schema(self._schemas(V2_REF)),
            "securityDefinitions": {"BearerToken": dict(SECURITY_SCHEME)},
            "security": [{"BearerToken": []}],
        }
