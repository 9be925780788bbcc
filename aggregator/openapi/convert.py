"""OpenAPI v2 -> v3 for servers that publish no `/openapi/v3` (kube-openapi `openapiconv.ConvertV2ToV3`).

kube-aggregator serves such a server's group-version from its v2 document, filtered to the
group-version's paths and converted; kubectl explain (v3 only since 1.27) then works for it too.
The conversion is upstream's, and as lossy: `#/definitions/` becomes `#/components/schemas/`, a
`$ref` with siblings is wrapped in `allOf` (builderutil.WrapRefs), a body parameter becomes a
`requestBody` per `consumes` type, a response schema a `content` entry per `produces` type, a
simple parameter a `schema` of its type and format. Beyond upstream: shared `parameters` become
`components.parameters` (upstream leaves their `$ref`s dangling), a simple parameter keeps its
`items`, and an operation without `produces` uses the document's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregator.openapi.merge import JSON, filter_paths, keep_prefixes

V2_DEFINITIONS = "#/definitions/"
V3_SCHEMAS = "#/components/schemas/"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def _extensions(obj: Mapping[str, Any]) -> JSON:
    return {k: v for k, v in obj.items() if k.startswith("x-")}


def _ref(ref: str, old: str, new: str) -> str:
    return new + ref[len(old) :] if ref.startswith(old) else ref


def convert_schema(schema: Any) -> Any:
    """`ConvertSchema` + `WrapRefs`: references into components, refs with siblings under allOf."""
    if not isinstance(schema, dict):
        return schema
    out: JSON = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _ref(value, V2_DEFINITIONS, V3_SCHEMAS)
        elif key in ("properties", "patternProperties", "definitions") and isinstance(value, dict):
            out[key] = {k: convert_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "additionalItems", "not"):
            out[key] = (
                [convert_schema(v) for v in value] if isinstance(value, list) else convert_schema(value)
            )
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [convert_schema(v) for v in value]
        else:
            out[key] = value
    if "$ref" in out and len(out) > 1:
        ref = out.pop("$ref")
        out["allOf"] = [{"$ref": ref}]
    return out


def _parameter(param: Mapping[str, Any]) -> JSON:
    if "$ref" in param:
        return {"$ref": _ref(str(param["$ref"]), "#/parameters/", "#/components/parameters/")}
    out: JSON = {"name": param.get("name", ""), "in": param.get("in", "")}
    for key in ("description", "required", "allowEmptyValue"):
        if param.get(key):
            out[key] = param[key]
    if "schema" in param:
        out["schema"] = convert_schema(param["schema"])
    else:
        simple: JSON = {"type": param.get("type", "")}
        if param.get("format"):
            simple["format"] = param["format"]
        if "items" in param:
            simple["items"] = convert_schema(param["items"])
        if param.get("uniqueItems"):
            simple["uniqueItems"] = True
        out["schema"] = simple
    out.update(_extensions(param))
    return out


def _response(response: Mapping[str, Any], produces: list[str]) -> JSON:
    if "$ref" in response:
        return {"$ref": _ref(str(response["$ref"]), "#/responses/", "#/components/responses/")}
    out: JSON = {"description": response.get("description", "")}
    if "schema" in response and produces:
        schema = convert_schema(response["schema"])
        out["content"] = {media: {"schema": schema} for media in produces}
    out.update(_extensions(response))
    return out


def _operation(op: Mapping[str, Any], produces: list[str]) -> JSON:
    out: JSON = {}
    for key in ("tags", "summary", "description", "externalDocs", "operationId"):
        if op.get(key):
            out[key] = op[key]
    parameters = []
    for param in op.get("parameters") or []:
        if not isinstance(param, dict):
            continue
        if param.get("in") == "body" and "schema" in param:
            schema = convert_schema(param["schema"])
            out["requestBody"] = {
                "content": {media: {"schema": schema} for media in op.get("consumes") or []}
            }
        else:
            parameters.append(_parameter(param))
    if parameters:
        out["parameters"] = parameters
    if "requestBody" in out:  # Go's field order: parameters, then requestBody
        out["requestBody"] = out.pop("requestBody")
    responses = op.get("responses")
    if isinstance(responses, dict):
        types = op.get("produces") or produces
        out["responses"] = {
            code: _response(r, types) if not code.startswith("x-") else r
            for code, r in responses.items()
            if isinstance(r, dict) or code.startswith("x-")
        }
    if op.get("deprecated"):
        out["deprecated"] = True
    out.update(_extensions(op))
    return out


def _path_item(item: Mapping[str, Any], produces: list[str]) -> JSON:
    out: JSON = {}
    if "$ref" in item:
        out["$ref"] = item["$ref"]
    for method in _METHODS:
        if isinstance(item.get(method), dict):
            out[method] = _operation(item[method], produces)
    params = [p for p in item.get("parameters") or [] if isinstance(p, dict)]
    if params:
        out["parameters"] = [_parameter(p) for p in params]
    out.update(_extensions(item))
    return out


def _security_scheme(scheme: Mapping[str, Any]) -> JSON:
    out: JSON = {k: scheme[k] for k in ("type", "description", "name", "in") if scheme.get(k)}
    if scheme.get("flow"):
        flow = {"authorizationUrl": scheme.get("authorizationUrl"), "tokenUrl": scheme.get("tokenUrl")}
        flow = {k: v for k, v in flow.items() if v}
        flow["scopes"] = scheme.get("scopes") or {}
        out["flows"] = {scheme["flow"]: flow}
    out.update(_extensions(scheme))
    return out


def convert_v2_to_v3(spec: Mapping[str, Any]) -> JSON:
    produces = [p for p in spec.get("produces") or [] if isinstance(p, str)]
    out: JSON = {"openapi": "3.0.0"}
    if "info" in spec:
        out["info"] = spec["info"]
    if "externalDocs" in spec:
        out["externalDocs"] = spec["externalDocs"]
    paths = spec.get("paths") or {}
    out["paths"] = {
        path: _path_item(item, produces) if not path.startswith("x-") else item
        for path, item in paths.items()
        if isinstance(item, dict) or path.startswith("x-")
    }
    components: JSON = {}
    if isinstance(spec.get("definitions"), dict):
        components["schemas"] = {k: convert_schema(v) for k, v in spec["definitions"].items()}
    if isinstance(spec.get("securityDefinitions"), dict):
        components["securitySchemes"] = {
            k: _security_scheme(v) for k, v in spec["securityDefinitions"].items()
        }
    if isinstance(spec.get("responses"), dict):
        components["responses"] = {k: _response(v, produces) for k, v in spec["responses"].items()}
    if isinstance(spec.get("parameters"), dict):
        components["parameters"] = {k: _parameter(v) for k, v in spec["parameters"].items()}
    out["components"] = components
    return out


def group_version_document(spec: Mapping[str, Any], key: str) -> JSON | None:
    """The v3 document for `key` (`apis/<g>/<v>`): its paths of the v2 document, converted; None if none."""
    prefix = f"/{key}/"
    filtered = filter_paths(dict(spec), keep_prefixes([prefix]))
    if not any(path.startswith(prefix) for path in filtered.get("paths") or {}):
        return None
    return convert_v2_to_v3(filtered)
