"""Discovery documents of the sample server, rendered once at start-up.

Legacy: `/apis` (APIGroupList), `/apis/<group>` (APIGroup), `/apis/<group>/<version>`
(APIResourceList). Aggregated: `/apis` with `Accept: ...;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`
(v2beta1 too, which kubectl 1.27/1.28 ask for), with the ETag kube-apiserver computes
(uppercase hex SHA-512 of the list without kind/apiVersion) and 304 on an exact If-None-Match.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from aggregator.wire.jsonenc import encode_object, go_marshal
from sample_apiserver.api import GROUP, PREFERRED_VERSION, VERSIONS, ResourceType, resources_in

JSON = dict[str, Any]

DISCOVERY_GROUP = "apidiscovery.k8s.io"
DISCOVERY_KIND = "APIGroupDiscoveryList"
AGGREGATED_VERSIONS = ("v2", "v2beta1")
AGGREGATED_CONVERSIONS = frozenset((DISCOVERY_GROUP, v, DISCOVERY_KIND) for v in AGGREGATED_VERSIONS)
# The version objects are stored in (sample-apiserver encodes storage as v1alpha1).
STORAGE_VERSION = "v1alpha1"


def storage_version_hash(kind: str) -> str:
    """apiserver `discovery.StorageVersionHash`: base64 of the first 8 bytes of sha256(g/v/kind)."""
    digest = hashlib.sha256(f"{GROUP}/{STORAGE_VERSION}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def _group_versions() -> list[JSON]:
    return [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]


def api_group() -> JSON:
    return {
        "name": GROUP,
        "versions": _group_versions(),
        "preferredVersion": {"groupVersion": f"{GROUP}/{PREFERRED_VERSION}", "version": PREFERRED_VERSION},
    }


def api_group_list() -> JSON:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}


def api_resource(resource: ResourceType) -> JSON:
    out: JSON = {
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": list(resource.verbs),
    }
    if resource.short_names:
        out["shortNames"] = list(resource.short_names)
    if resource.categories:
        out["categories"] = list(resource.categories)
    out["storageVersionHash"] = storage_version_hash(resource.kind)
    return out


def api_resource_list(version: str) -> JSON:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{version}",
        "resources": [api_resource(r) for r in resources_in(version)],
    }


def resource_discovery(resource: ResourceType) -> JSON:
    out: JSON = {
        "resource": resource.plural,
        "responseKind": {"group": "", "version": "", "kind": resource.kind},
        "scope": "Namespaced" if resource.namespaced else "Cluster",
        "singularResource": resource.singular,
        "verbs": list(resource.verbs),
    }
    if resource.short_names:
        out["shortNames"] = list(resource.short_names)
    if resource.categories:
        out["categories"] = list(resource.categories)
    return out


def aggregated_items() -> list[JSON]:
    return [
        {
            "metadata": {"name": GROUP},
            "versions": [
                {
                    "version": v,
                    "resources": [resource_discovery(r) for r in resources_in(v)],
                    "freshness": "Current",
                }
                for v in VERSIONS
            ],
        }
    ]


@dataclass(frozen=True)
class Rendered:
    """One document in every encoding a client may ask for."""

    json: bytes
    pretty: bytes
    yaml: bytes


def _render(obj: JSON) -> Rendered:
    return Rendered(
        encode_object(obj),
        encode_object(obj, pretty=True),
        yaml.safe_dump(obj, sort_keys=False).encode(),
    )


class Discovery:
    """Pre-rendered bytes for every discovery path."""

    def __init__(self) -> None:
        self.group_list = _render(api_group_list())
        self.group = _render({"kind": "APIGroup", "apiVersion": "v1", **api_group()})
        self.resource_lists = {v: _render(api_resource_list(v)) for v in VERSIONS}
        items = aggregated_items()
        self.etag = hashlib.sha512(go_marshal({"metadata": {}, "items": items})).hexdigest().upper()
        self.aggregated = {
            v: _render(
                {
                    "kind": DISCOVERY_KIND,
                    "apiVersion": f"{DISCOVERY_GROUP}/{v}",
                    "metadata": {},
                    "items": items,
                }
            )
            for v in AGGREGATED_VERSIONS
        }

    @staticmethod
    def aggregated_content_type(media_type: str, version: str) -> str:
        return f"{media_type};g={DISCOVERY_GROUP};v={version};as={DISCOVERY_KIND}"
