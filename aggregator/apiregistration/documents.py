"""What local mode's `apiregistration.k8s.io/v1` serves, as plain encoding functions.

The APIService object, its Table rows and PartialObjectMetadata, the group's APIGroup and
APIResourceList, all in kube-apiserver's field order and omitempty rules, and the Accept
restriction of its resource endpoints. No I/O and no state: `api.py` serves them.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
from collections.abc import Mapping
from typing import Any

from aggregator.model import apiservice as model
from aggregator.model.apiservice import APIService
from aggregator.model.meta import human_duration, ordered_metadata
from aggregator.model.status import status_body
from aggregator.web.context import RequestContext
from aggregator.web.serverrequest import Response
from aggregator.wire.jsonenc import encode_object, go_marshal_indent
from aggregator.wire.negotiation import GVK, JSON, MediaType
from aggregator.wire.yamlenc import go_yaml

GROUP, VERSION, API_VERSION, KIND = model.GROUP, model.VERSION, model.API_VERSION, model.KIND
RESOURCE = "apiservices"
QUALIFIED = f"{RESOURCE}.{GROUP}"
PREFIX = f"/apis/{GROUP}/"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
HEADERS = {"Cache-Control": "no-cache, private"}
DEFAULT_WATCH_SECONDS = 1800.0

# kube-apiserver's own listing of this group-version (storageVersionHash included), with the verbs
# local mode serves: the folder is the source of truth, so writes answer 405 and are not advertised
# (upstream derives discovery verbs from the storage's interfaces, `endpoints/installer.go`; a
# read-only storage lists get, list, watch).
READ_VERBS = ["get", "list", "watch"]
STATUS_VERBS = ["get"]
RESOURCE_LIST: dict[str, Any] = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": API_VERSION,
    "resources": [
        {
            "name": "apiservices",
            "singularName": "apiservice",
            "namespaced": False,
            "kind": KIND,
            "verbs": READ_VERBS,
            "categories": ["api-extensions"],
            "storageVersionHash": "InPBPD7+PqM=",
        },
        {
            "name": "apiservices/status",
            "singularName": "",
            "namespaced": False,
            "kind": KIND,
            "verbs": STATUS_VERBS,
        },
    ],
}
API_GROUP: dict[str, Any] = {
    "kind": "APIGroup",
    "apiVersion": "v1",
    "name": GROUP,
    "versions": [{"groupVersion": API_VERSION, "version": VERSION}],
    "preferredVersion": {"groupVersion": API_VERSION, "version": VERSION},
}

NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources "
    "may allow a client to request the generation of an appropriate name automatically. Name is primarily "
    "intended for creation idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
CREATION_TIMESTAMP_DOC = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. "
    "It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. "
    "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "description": NAME_DOC, "priority": 0},
    {
        "name": "Service",
        "type": "string",
        "format": "",
        "description": "The reference to the service that hosts this API endpoint.",
        "priority": 0,
    },
    {
        "name": "Available",
        "type": "string",
        "format": "",
        "description": "Whether this service is available.",
        "priority": 0,
    },
    {"name": "Age", "type": "string", "format": "", "description": CREATION_TIMESTAMP_DOC, "priority": 0},
]


# --- pure encoding -----------------------------------------------------------------------------------


def object_metadata(svc: APIService, uid: str, created: str) -> dict[str, Any]:
    """ObjectMeta in Go field order: the manifest's metadata plus what the server fills in."""
    raw = svc.raw.get("metadata") if isinstance(svc.raw.get("metadata"), Mapping) else {}
    assert isinstance(raw, Mapping)
    filled = dict(raw)
    filled["name"] = svc.name
    filled.setdefault("uid", uid)
    filled["resourceVersion"] = svc.resource_version
    filled.setdefault("creationTimestamp", created)
    filled.pop("namespace", None)
    filled.pop("managedFields", None)
    return ordered_metadata(filled)


def encode_apiservice(svc: APIService, uid: str, created: str) -> dict[str, Any]:
    """The APIService as kube-apiserver serializes it (Go struct field order, omitempty rules)."""
    spec: dict[str, Any] = {}
    if svc.service is not None:
        ref: dict[str, Any] = {}
        if svc.service.namespace:
            ref["namespace"] = svc.service.namespace
        if svc.service.name:
            ref["name"] = svc.service.name
        ref["port"] = svc.service.port
        spec["service"] = ref
    if svc.group:
        spec["group"] = svc.group
    if svc.version:
        spec["version"] = svc.version
    if svc.insecure_skip_tls_verify:
        spec["insecureSkipTLSVerify"] = True
    if svc.ca_bundle:
        spec["caBundle"] = base64.b64encode(svc.ca_bundle).decode()
    spec["groupPriorityMinimum"] = svc.group_priority_minimum
    spec["versionPriority"] = svc.version_priority
    status: dict[str, Any] = {}
    if svc.conditions:
        status["conditions"] = [c.to_json() for c in svc.conditions]
    return {
        "kind": KIND,
        "apiVersion": API_VERSION,
        "metadata": object_metadata(svc, uid, created),
        "spec": spec,
        "status": status,
    }


def table_row(
    obj: Mapping[str, Any], svc: APIService, include: str, meta_version: str, now: dt.datetime
) -> dict[str, Any]:
    created = obj["metadata"].get("creationTimestamp")
    age = "<unknown>"
    if created:
        with contextlib.suppress(ValueError):
            when = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
            age = human_duration((now - when).total_seconds())
    row: dict[str, Any] = {"cells": [svc.name, model.service_column(svc), model.available_column(svc), age]}
    if include == "Object":
        row["object"] = obj
    elif include == "None":
        row["object"] = None
    else:
        row["object"] = partial_metadata(obj, meta_version)
    return row


def partial_metadata(obj: Mapping[str, Any], meta_version: str) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"{META_GROUP}/{meta_version}",
        "metadata": obj["metadata"],
    }


# --- negotiation for resource endpoints --------------------------------------------------------------


def resource_restriction(media_type: str, convert: GVK | None) -> bool:
    """`RequestScope.AllowsMediaTypeTransform`: plain, Table (JSON/YAML), or PartialObjectMetadata[List]."""
    if convert is None:
        return True
    if convert.group != META_GROUP or convert.version not in META_VERSIONS:
        return False
    if convert.kind == "Table":
        return media_type.startswith("application/") and media_type in (JSON, "application/yaml")
    return convert.kind in ("PartialObjectMetadata", "PartialObjectMetadataList")


def error_response(
    ctx: RequestContext | None, code: int, message: str, details: dict[str, Any] | None = None
) -> Response:
    body = status_body(code, message, details=details)
    pretty = ctx is not None and ctx.pretty
    response = Response(code, encode_object(body, pretty=pretty), {"Content-Type": JSON, **HEADERS})
    response.status_object = body
    return response


def encode(doc: Mapping[str, Any], media: MediaType, ctx: RequestContext) -> bytes:
    if media.media_type == "application/yaml":
        return go_yaml(doc)
    if media.pretty or ctx.pretty:
        return go_marshal_indent(doc)
    return encode_object(doc)


def content_type(media: MediaType) -> str:
    if media.convert is None:
        return media.media_type
    c = media.convert
    return f"{media.media_type};g={c.group};v={c.version};as={c.kind}"
