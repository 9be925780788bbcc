"""Local mode's `apiregistration.k8s.io/v1`: the store's APIServices served read-only, like kube-apiserver.

`/apis` lists `apiregistration.k8s.io` first (as upstream always does), so in local mode the gateway
serves that group itself: its APIGroup and APIResourceList, and list, get and watch of the APIServices
it holds, with their current conditions. `kubectl get apiservices` (Table output), `-o yaml`, `-w`
and metadata-only clients work. Writes answer 405: the folder is the source of truth. In kube mode
this group belongs to kube-apiserver and none of this is installed.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from aggregator.model import apiservice as model
from aggregator.model.apiservice import APIService
from aggregator.model.meta import human_duration, ordered_metadata
from aggregator.model.status import status_body
from aggregator.sources.store import ADDED, Event, Kind, Store
from aggregator.web.responses import wants_pretty
from aggregator.web.routing import Route, RouteKind
from aggregator.wire.jsonenc import encode_object, go_marshal_indent
from aggregator.wire.negotiation import GVK, JSON, MediaType, Negotiator, not_acceptable_body
from aggregator.wire.rendered import Rendered, respond
from aggregator.wire.yamlenc import go_yaml

if TYPE_CHECKING:
    from aggregator.server import Gateway

log = logging.getLogger(__name__)

GROUP, VERSION, API_VERSION, KIND = model.GROUP, model.VERSION, model.API_VERSION, model.KIND
RESOURCE = "apiservices"
QUALIFIED = f"{RESOURCE}.{GROUP}"
PREFIX = f"/apis/{GROUP}/"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
HEADERS = {"Cache-Control": "no-cache, private"}
DEFAULT_WATCH_SECONDS = 1800.0

# kube-apiserver's own listing of this group-version (storageVersionHash included).
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
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "categories": ["api-extensions"],
            "storageVersionHash": "InPBPD7+PqM=",
        },
        {
            "name": "apiservices/status",
            "singularName": "",
            "namespaced": False,
            "kind": KIND,
            "verbs": ["get", "patch", "update"],
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


def _error(
    request: web.Request | None, code: int, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    body = status_body(code, message, details=details)
    pretty = request is not None and wants_pretty(request)
    return web.Response(
        status=code, body=encode_object(body, pretty=pretty), headers={"Content-Type": JSON, **HEADERS}
    )


def _encode(doc: Mapping[str, Any], media: MediaType, request: web.Request) -> bytes:
    if media.media_type == "application/yaml":
        return go_yaml(doc)
    if media.pretty or wants_pretty(request):
        return go_marshal_indent(doc)
    return encode_object(doc)


def _content_type(media: MediaType) -> str:
    if media.convert is None:
        return media.media_type
    c = media.convert
    return f"{media.media_type};g={c.group};v={c.version};as={c.kind}"


@dataclass
class _Identity:
    uid: str
    created: str


# --- the component -----------------------------------------------------------------------------------


class APIRegistration:
    """Serves the store's APIServices under `/apis/apiregistration.k8s.io/v1` (local mode)."""

    def __init__(self, store: Store, *, history: int = 1000) -> None:
        self.store = store
        self._identities: dict[str, _Identity] = {}
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._compacted_through = 0  # events up to this revision are no longer replayable
        self._negotiate_plain = Negotiator(lambda _m, convert: convert is None)
        self._negotiate_resource = Negotiator(resource_restriction)
        self._group = Rendered.of(API_GROUP)
        self._resources = Rendered.of(RESOURCE_LIST)
        for svc in store.apiservices():
            self._identify(svc)
        store.add_listener(self._on_event)

    def install(self, gateway: Gateway) -> None:
        router = gateway.router
        router.add_exact(f"/apis/{GROUP}", Route(self.serve_group, RouteKind.OWN, "apiregistration"))
        router.add_exact(f"/apis/{GROUP}/", Route(self.serve_group, RouteKind.OWN, "apiregistration"))
        resources = Route(self.serve_resource_list, RouteKind.OWN, "apiregistration")
        router.add_exact(f"/apis/{API_VERSION}", resources)
        router.add_exact(f"/apis/{API_VERSION}/", resources)
        router.add_prefix(PREFIX, Route(self.serve_apiservices, RouteKind.OWN, "apiregistration"))

    # --- identities and history -------------------------------------------------------------------

    def _identify(self, svc: APIService) -> _Identity:
        identity = self._identities.get(svc.name)
        if identity is None:
            identity = _Identity(str(uuid.uuid4()), model.now_rfc3339())
            self._identities[svc.name] = identity
        return identity

    def _on_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE:
            return
        assert isinstance(event.obj, APIService)
        if event.type == ADDED:
            # A new object (possibly re-created under an old name): a new uid and creation time. A
            # deleted one keeps its identity so its DELETED event still describes it.
            self._identities.pop(event.obj.name, None)
        self._identify(event.obj)
        if len(self._history) == self._history.maxlen:
            self._compacted_through = self._history[0].revision
        self._history.append(event)

    def encode(self, svc: APIService) -> dict[str, Any]:
        identity = self._identify(svc)
        return encode_apiservice(svc, identity.uid, identity.created)

    # --- handlers ---------------------------------------------------------------------------------

    async def serve_group(self, request: web.Request) -> web.StreamResponse:
        return self._serve_static(request, self._group)

    async def serve_resource_list(self, request: web.Request) -> web.StreamResponse:
        return self._serve_static(request, self._resources)

    def _serve_static(self, request: web.Request, rendered: Rendered) -> web.StreamResponse:
        media = self._negotiate_plain(request.headers.get("Accept", ""))
        if media is None:
            return web.Response(status=406, body=not_acceptable_body(), headers={"Content-Type": JSON})
        return respond(request, rendered, media, headers=HEADERS)

    async def serve_apiservices(self, request: web.Request) -> web.StreamResponse:
        parts = request.path[len(PREFIX) :].rstrip("/").split("/")
        if len(parts) < 2 or parts[0] != VERSION or parts[1] != RESOURCE or len(parts) > 4:
            return _error(request, 404, "the server could not find the requested resource", {})
        name = parts[2] if len(parts) >= 3 else None
        sub = parts[3] if len(parts) == 4 else None
        if sub is not None and sub != "status":
            return _error(request, 404, "the server could not find the requested resource", {})
        if request.method not in ("GET", "HEAD"):
            return self._method_not_allowed(request, name)
        media = self._negotiate_resource(request.headers.get("Accept", ""))
        if media is None:
            return web.Response(status=406, body=not_acceptable_body(), headers={"Content-Type": JSON})
        if name is None:
            if request.query.get("watch") in ("1", "true", "True", "t", "T", "TRUE"):
                return await self._watch(request, media)
            return self._list(request, media)
        return self._get(request, media, name)

    def _method_not_allowed(self, request: web.Request, name: str | None) -> web.Response:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(request.method, "")
        if request.method == "DELETE":
            verb = "delete" if name else "deletecollection"
        verb = verb or request.method.lower()
        message = (
            f'{verb} is not supported on resources of kind "{QUALIFIED}": this gateway serves APIServices '
            "read-only from its --apiservices-dir"
        )
        log.info(
            "refused a write to apiservices", extra={"fields": {"method": request.method, "name": name or ""}}
        )
        return _error(request, 405, message, {"group": GROUP, "kind": RESOURCE})

    def _selected(self, request: web.Request) -> list[APIService] | web.Response:
        items = sorted(self.store.apiservices(), key=lambda s: s.name)
        try:
            return [
                s
                for s in items
                if matches(s, request.query.get("labelSelector", ""), request.query.get("fieldSelector", ""))
            ]
        except ValueError as err:
            return _error(request, 400, str(err))

    def _list(self, request: web.Request, media: MediaType) -> web.Response:
        selected = self._selected(request)
        if isinstance(selected, web.Response):
            return selected
        revision = str(self.store.revision)
        objects = [(self.encode(s), s) for s in selected]
        kind = media.convert.kind if media.convert is not None else None
        if kind == "PartialObjectMetadata":
            return _error(
                request,
                406,
                "you requested PartialObjectMetadata, but the requested object is a list (*v1.APIServiceList)",
            )
        doc: dict[str, Any]
        if kind == "Table":
            assert media.convert is not None
            doc = self._table(request, media.convert.version, objects, revision)
        elif kind == "PartialObjectMetadataList":
            assert media.convert is not None
            version = media.convert.version
            doc = {
                "kind": "PartialObjectMetadataList",
                "apiVersion": f"{META_GROUP}/{version}",
                "metadata": {"resourceVersion": revision},
                "items": [partial_metadata(obj, version) for obj, _ in objects],
            }
        else:
            doc = {
                "kind": "APIServiceList",
                "apiVersion": API_VERSION,
                "metadata": {"resourceVersion": revision},
                "items": [obj for obj, _ in objects],
            }
        return web.Response(
            body=_encode(doc, media, request), headers={"Content-Type": _content_type(media), **HEADERS}
        )

    def _get(self, request: web.Request, media: MediaType, name: str) -> web.Response:
        svc = self.store.apiservice(name)
        if svc is None:
            return _error(
                request,
                404,
                f'{QUALIFIED} "{name}" not found',
                {"name": name, "group": GROUP, "kind": RESOURCE},
            )
        obj = self.encode(svc)
        kind = media.convert.kind if media.convert is not None else None
        if kind == "PartialObjectMetadataList":
            return _error(
                request,
                406,
                "you requested PartialObjectMetadataList, but the requested object is not a list (*v1.APIService)",
            )
        if kind == "Table":
            assert media.convert is not None
            doc = self._table(request, media.convert.version, [(obj, svc)], svc.resource_version)
        elif kind == "PartialObjectMetadata":
            assert media.convert is not None
            doc = partial_metadata(obj, media.convert.version)
        else:
            doc = obj
        return web.Response(
            body=_encode(doc, media, request), headers={"Content-Type": _content_type(media), **HEADERS}
        )

    def _table(
        self,
        request: web.Request,
        meta_version: str,
        objects: Iterable[tuple[dict[str, Any], APIService]],
        revision: str,
    ) -> dict[str, Any]:
        include = request.query.get("includeObject", "Metadata") or "Metadata"
        now = dt.datetime.now(dt.UTC)
        metadata = {"resourceVersion": revision} if revision else {}
        return {
            "kind": "Table",
            "apiVersion": f"{META_GROUP}/{meta_version}",
            "metadata": metadata,
            "columnDefinitions": COLUMNS,
            "rows": [table_row(obj, svc, include, meta_version, now) for obj, svc in objects],
        }

    # --- watch ------------------------------------------------------------------------------------

    async def _watch(self, request: web.Request, media: MediaType) -> web.StreamResponse:
        label, field = request.query.get("labelSelector", ""), request.query.get("fieldSelector", "")
        try:
            matches(None, label, field)
        except ValueError as err:
            return _error(request, 400, str(err))
        since = request.query.get("resourceVersion", "")
        timeout = DEFAULT_WATCH_SECONDS
        with contextlib.suppress(ValueError):
            timeout = float(request.query.get("timeoutSeconds", "")) or timeout
        # Subscribe and snapshot in the same tick: nothing can slip between the two.
        subscription = self.store.subscribe()
        initial: list[tuple[str, APIService]] = []
        if since in ("", "0"):
            initial = [("ADDED", s) for s in sorted(self.store.apiservices(), key=lambda s: s.name)]
        else:
            try:
                start = int(since)
            except ValueError:
                subscription.close()
                return _error(request, 400, f'resourceVersion: Invalid value: "{since}": must be an integer')
            if start < self._compacted_through:
                subscription.close()
                oldest = self._history[0].revision if self._history else self.store.revision
                return _error(request, 410, f"too old resource version: {start} ({oldest})")
            for event in self._history:
                if event.revision > start and isinstance(event.obj, APIService):
                    initial.append((event.type, event.obj))
        response = web.StreamResponse(headers={"Content-Type": _content_type(media), **HEADERS})
        await response.prepare(request)
        try:
            async with asyncio.timeout(timeout):
                for kind, svc in initial:
                    if matches(svc, label, field):
                        await response.write(self._watch_line(kind, svc, media, request))
                async for event in subscription:
                    obj = event.obj
                    if isinstance(obj, APIService) and matches(obj, label, field):
                        await response.write(self._watch_line(event.type, obj, media, request))
        except TimeoutError:
            pass
        except (ConnectionResetError, asyncio.CancelledError):
            subscription.close()
            raise
        finally:
            subscription.close()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    def _watch_line(self, kind: str, svc: APIService, media: MediaType, request: web.Request) -> bytes:
        obj: dict[str, Any] = self.encode(svc)
        convert = media.convert
        if convert is not None and convert.kind == "Table":
            obj = self._table(request, convert.version, [(obj, svc)], svc.resource_version)
        elif convert is not None and convert.kind.startswith("PartialObjectMetadata"):
            obj = partial_metadata(obj, convert.version)
        return encode_object({"type": kind, "object": obj})


# --- selectors ---------------------------------------------------------------------------------------


def _requirements(selector: str, what: str) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for raw in filter(None, (p.strip() for p in selector.split(","))):
        for op in ("!=", "==", "="):
            if op in raw:
                key, _, value = raw.partition(op)
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            if " in " in raw or " notin " in raw or "(" in raw:
                raise ValueError(
                    f"unable to parse requirement: {what} set-based selectors are not supported here: {raw!r}"
                )
            if raw.startswith("!"):
                out.append((raw[1:].strip(), "!", ""))
            else:
                out.append((raw, "exists", ""))
    return out


def matches(svc: APIService | None, label_selector: str, field_selector: str) -> bool:
    """Equality-based label selectors and the `metadata.name` field selector (all APIServices support)."""
    labels_req = _requirements(label_selector, "label")
    fields_req = _requirements(field_selector, "field")
    for key, op, _ in fields_req:
        if key != "metadata.name" or op in ("exists", "!"):
            raise ValueError(f"field label not supported: {key}")
    if svc is None:
        return True
    meta = svc.raw.get("metadata") if isinstance(svc.raw.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    for key, op, value in labels_req:
        present = key in labels
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return all((op == "=") == (svc.name == value) for _, op, value in fields_req)


def install_apiregistration(gateway: Gateway) -> APIRegistration | None:
    """Local mode only: in kube mode the group is kube-apiserver's."""
    if not gateway.options.local_mode:
        return None
    component = APIRegistration(gateway.store)
    component.install(gateway)
    return component
