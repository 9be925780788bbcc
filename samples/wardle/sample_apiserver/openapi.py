"""OpenAPI documents of the sample server: v3 per group-version and a v2 document.

Built once at start-up in kube-apiserver's layout (`aggregator/openapi/builder.py`): schemas with
`x-kubernetes-group-version-kind` and field descriptions (`kubectl explain`), the standard meta/v1
definitions they reference, and one operation per verb with inline query parameters. The PATCH
operations list `fieldValidation`, which is how kubectl decides to validate on the server
(`queryParamVerifierV3`) instead of downloading schemas to validate on the client.
"""

from __future__ import annotations

import hashlib
from typing import Any

from aggregator.openapi import builder
from aggregator.openapi.gnostic import encode_document
from aggregator.wire.jsonenc import go_marshal
from sample_apiserver.api import GROUP, VERSIONS, ResourceType, resources_in

JSON = dict[str, Any]

INFO = {"title": "Wardle", "version": "0.1"}


def _definition_prefix(version: str) -> str:
    """`com.example.wardle.v1beta1.`: kube-openapi's friendly name (reversed group) for our kinds."""
    return ".".join(reversed(GROUP.split("."))) + f".{version}."


class _Schemas:
    """Schemas in v3 form, with `$ref` given as bare definition names until rendered."""

    def __init__(self, meta: JSON) -> None:
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
                builder.META + ("ListMeta" if list_meta else "ObjectMeta"),
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


def _paths(versions: tuple[str, ...]) -> list[builder.Path]:
    paths: list[builder.Path] = []
    for version in versions:
        paths.append(builder.group_version_path(GROUP, version))
        for r in resources_in(version):
            described = builder.Resource(
                GROUP,
                version,
                r.kind,
                r.plural,
                _definition_prefix(version),
                namespaced=r.namespaced,
                watch_params_sorted=False,  # as this server has always published them
            )
            paths.extend(builder.resource_paths(described))
    return paths


def _schemas(meta: JSON, versions: tuple[str, ...]) -> JSON:
    schemas = _Schemas(meta)
    out: JSON = {}
    for version in versions:
        for resource in resources_in(version):
            out.update(schemas.kind_schemas(resource, version))
    out.update(builder.expand_markers(meta["schemas"], meta["fields"], GROUP, versions))
    return out


def build_v3(version: str, meta: JSON | None = None) -> JSON:
    meta = meta if meta is not None else builder.load_meta()
    return builder.Spec(INFO, _paths((version,)), _schemas(meta, (version,)), meta["parameters"]).v3()


def build_v2(meta: JSON | None = None) -> JSON:
    meta = meta if meta is not None else builder.load_meta()
    return builder.Spec(INFO, _paths(VERSIONS), _schemas(meta, VERSIONS), meta["parameters"]).v2()


def etag_of(data: bytes) -> str:
    """kube-openapi's ETag: uppercase hex SHA-512 of the served bytes."""
    return hashlib.sha512(data).hexdigest().upper()


class OpenAPIDocuments:
    """Rendered bytes and ETags: `/openapi/v3` index, one document per group-version, `/openapi/v2`."""

    def __init__(self) -> None:
        meta = builder.load_meta()
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
