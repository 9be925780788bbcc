"""The REST verbs on flunders and fischers: get, list, watch, create, update, patch, delete,
deletecollection, with apiserver's semantics and error bodies.

Objects live in the ObjectStore in the internal form; every response converts to the version of
the request path. Output is JSON (default), YAML, or a `meta.k8s.io` Table when the Accept header
asks for one.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import random
import secrets
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

import sample_apiserver.errors as errors
from aggregator.model.fielderrors import go_quote, is_valid_path_segment_name
from aggregator.model.meta import ordered_metadata
from aggregator.web.requestinfo import RequestInfo
from aggregator.wire.jsonenc import encode_object
from sample_apiserver.api import (
    FISCHERS,
    FLUNDERS,
    GROUP,
    FieldError,
    ResourceType,
    invalid,
    required,
    resource_for,
)
from sample_apiserver.decoding import DecodeError, check_fields, object_schema, parse_body, plain
from sample_apiserver.errors import APIError
from sample_apiserver.negotiation import Negotiated, negotiate
from sample_apiserver.patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from sample_apiserver.responses import wants_pretty
from sample_apiserver.selectors import SelectorError, object_predicate
from sample_apiserver.store import Event, ObjectStore, TooOldResourceVersion, Watcher
from sample_apiserver.table import INCLUDE_OBJECT_VALUES, render_table

JSON = dict[str, Any]

TABLE_CONVERSIONS = frozenset({("meta.k8s.io", "v1", "Table"), ("meta.k8s.io", "v1beta1", "Table")})
OUTPUT_TYPES = ("application/json", "application/yaml")
BODY_TYPES = ("application/json", "application/yaml")
PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
FIELD_VALIDATION = ("Ignore", "Warn", "Strict")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's SimpleNameGenerator alphabet


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WatchSettings:
    bookmark_interval: float = 60.0
    min_request_timeout: float = 1800.0


def _options_invalid(kind: str, errs: list[FieldError]) -> APIError:
    listed = str(errs[0]) if len(errs) == 1 else "[" + ", ".join(str(e) for e in errs) + "]"
    return APIError(
        422,
        f'{kind}.meta.k8s.io "" is invalid: {listed}',
        details={
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [{"reason": e.reason, "message": e.body, "field": e.path} for e in errs],
        },
    )


def _unsupported(path: str, value: str, supported: tuple[str, ...]) -> FieldError:
    listed = ", ".join(go_quote(s) for s in supported)
    return FieldError(path, "Unsupported value", f"supported values: {listed}", value, True)


class ResourceHandlers:
    """Serves every resource request of the group from one ObjectStore."""

    def __init__(self, store: ObjectStore, watch: WatchSettings) -> None:
        self.store = store
        self.watch_settings = watch

    # --- entry point -----------------------------------------------------------------------------

    async def handle(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        resource = resource_for(info.api_version, info.resource)
        if resource is None or info.subresource or (info.namespace and not resource.namespaced):
            raise APIError(404, "the server could not find the requested resource", details={})
        version = info.api_version
        handlers: dict[str, Callable[..., Any]] = {
            "get": self.get,
            "list": self.list_collection,
            "watch": self.watch,
            "create": self.create,
            "update": self.update,
            "patch": self.patch,
            "delete": self.delete,
            "deletecollection": self.delete_collection,
        }
        if info.verb == "create" and info.name:
            raise errors.method_not_allowed(resource, "POST")
        if info.verb in ("update", "patch") and not info.name:
            raise errors.method_not_allowed(resource, info.verb.upper() if info.verb == "patch" else "PUT")
        handler = handlers.get(info.verb)
        if handler is None:
            raise errors.method_not_allowed(resource, request.method)
        result: web.StreamResponse = await handler(request, info, resource, version)
        return result

    # --- output ----------------------------------------------------------------------------------

    def _negotiate(self, request: web.Request, *, allow_table: bool = True) -> Negotiated:
        chosen = negotiate(
            request.headers.get("Accept", ""), OUTPUT_TYPES, TABLE_CONVERSIONS if allow_table else frozenset()
        )
        if chosen is None:
            raise APIError(
                406,
                "only the following media types are accepted: " + ", ".join(OUTPUT_TYPES),
                reason="NotAcceptable",
            )
        return chosen

    def _write(
        self,
        request: web.Request,
        obj: Any,
        negotiated: Negotiated,
        status: int = 200,
        warnings: Sequence[str] = (),
    ) -> web.Response:
        if negotiated.media_type == "application/yaml":
            body = yaml.safe_dump(obj, sort_keys=False).encode()
        else:
            body = encode_object(obj, pretty=wants_pretty(request))
        response = web.Response(body=body, status=status, content_type=negotiated.media_type)
        for warning in warnings:
            response.headers.add("Warning", f"299 - {go_quote(warning)}")
        return response

    def _table_options(self, request: web.Request) -> str:
        include = request.query.get("includeObject", "")
        if include not in INCLUDE_OBJECT_VALUES:
            raise APIError(400, f"unrecognized includeObject value: {go_quote(include)}")
        return include

    def _respond_object(
        self,
        request: web.Request,
        resource: ResourceType,
        version: str,
        internal: JSON,
        status: int = 200,
        warnings: Sequence[str] = (),
        negotiated: Negotiated | None = None,
    ) -> web.Response:
        negotiated = negotiated or self._negotiate(request)
        obj = resource.to_version(internal, version)
        if negotiated.convert is not None:
            table = render_table(
                resource,
                [obj],
                list_meta={"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                include_object=self._table_options(request),
                table_version=negotiated.convert[1],
            )
            return self._write(request, table, negotiated, status, warnings)
        return self._write(request, obj, negotiated, status, warnings)

    # --- reads -----------------------------------------------------------------------------------

    def _existing(self, resource: ResourceType, info: RequestInfo) -> JSON:
        obj = self.store.get(resource.plural, info.namespace, info.name)
        if obj is None:
            raise errors.not_found(resource, info.name)
        return obj

    async def get(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request)
        return self._respond_object(
            request, resource, version, self._existing(resource, info), negotiated=negotiated
        )

    def _predicate(self, request: web.Request) -> Callable[[JSON], bool]:
        try:
            return object_predicate(
                request.query.get("labelSelector", ""), request.query.get("fieldSelector", "")
            )
        except SelectorError as err:
            raise APIError(400, str(err)) from err

    async def list_collection(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request)
        selected = self._predicate(request)
        _parse_resource_version(request.query.get("resourceVersion", ""))
        namespace = info.namespace if resource.namespaced and info.namespace else None
        objects = [o for o in self.store.list_objects(resource.plural, namespace) if selected(o)]
        list_meta: JSON = {"resourceVersion": str(self.store.revision)}
        start = _decode_continue(request.query.get("continue", ""))
        if start is not None:
            objects = [o for o in objects if _sort_key(o) > start]
        limit = _parse_int(request.query.get("limit", ""), "limit")
        if limit and limit > 0 and len(objects) > limit:
            remaining = len(objects) - limit
            objects = objects[:limit]
            list_meta["continue"] = _encode_continue(self.store.revision, _sort_key(objects[-1]))
            if not request.query.get("labelSelector") and not request.query.get("fieldSelector"):
                list_meta["remainingItemCount"] = remaining
        versioned = [resource.to_version(o, version) for o in objects]
        if negotiated.convert is not None:
            table = render_table(
                resource,
                versioned,
                list_meta=list_meta,
                include_object=self._table_options(request),
                table_version=negotiated.convert[1],
            )
            return self._write(request, table, negotiated)
        body = {
            "kind": resource.list_kind,
            "apiVersion": f"{GROUP}/{version}",
            "metadata": list_meta,
            "items": versioned,
        }
        return self._write(request, body, negotiated)

    # --- watch -----------------------------------------------------------------------------------

    async def watch(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.StreamResponse:
        negotiated = self._negotiate(request)
        query = request.query
        field_selector = query.get("fieldSelector", "")
        if info.name:  # /watch/.../<name>: a watch of one object
            name_selector = f"metadata.name={info.name}"
            field_selector = f"{field_selector},{name_selector}" if field_selector else name_selector
        try:
            selected = object_predicate(query.get("labelSelector", ""), field_selector)
        except SelectorError as err:
            raise APIError(400, str(err)) from err
        include_object = self._table_options(request) if negotiated.convert else ""
        rv_text = query.get("resourceVersion", "")
        since = _parse_resource_version(rv_text)
        bookmarks = query.get("allowWatchBookmarks", "") in _TRUE
        send_initial = query.get("sendInitialEvents")
        if send_initial is not None:
            initial = send_initial in _TRUE
            if initial and query.get("resourceVersionMatch") != "NotOlderThan":
                raise _options_invalid(
                    "ListOptions",
                    [
                        FieldError(
                            "resourceVersionMatch",
                            "Forbidden",
                            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                        )
                    ],
                )
            if initial and not bookmarks:
                raise _options_invalid(
                    "ListOptions",
                    [
                        required(
                            "allowWatchBookmarks",
                            "allowWatchBookmarks must be set to true when sendInitialEvents is set to true",
                        )
                    ],
                )
        else:
            initial = since is None or since == 0
        namespace = info.namespace if resource.namespaced and info.namespace else None
        timeout = _parse_int(query.get("timeoutSeconds", ""), "timeoutSeconds")
        if not timeout:
            minimum = self.watch_settings.min_request_timeout
            timeout_s = minimum * (random.random() + 1.0)
        else:
            timeout_s = float(timeout)

        def in_scope(obj: JSON) -> bool:
            return namespace is None or obj["metadata"].get("namespace", "") == namespace

        backlog: list[Event] = []
        watcher: Watcher | None = None
        expired: TooOldResourceVersion | None = None
        current: list[JSON] = []
        start_revision = self.store.revision
        try:
            if initial:
                current = [o for o in self.store.list_objects(resource.plural, namespace) if selected(o)]
                backlog, watcher = self.store.watch(resource.plural, None)
            else:
                backlog, watcher = self.store.watch(resource.plural, since)
        except TooOldResourceVersion as err:
            expired = err

        response = web.StreamResponse(status=200, headers={"Content-Type": negotiated.media_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        table_headers = True
        getter: asyncio.Future[Event | None] | None = None

        async def send(event_type: str, obj: JSON) -> None:
            nonlocal table_headers
            payload: JSON = obj
            if negotiated.convert is not None and event_type not in ("ERROR", "BOOKMARK"):
                payload = render_table(
                    resource,
                    [obj],
                    list_meta={"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                    include_object=include_object,
                    table_version=negotiated.convert[1],
                    headers=table_headers,
                )
                table_headers = False
            await response.write(encode_object({"type": event_type, "object": payload}))

        try:
            if expired is not None:
                await send("ERROR", APIError(410, str(expired), reason="Expired").body())
                return response
            assert watcher is not None
            for obj in current:
                await send("ADDED", resource.to_version(obj, version))
            if initial and send_initial is not None and bookmarks:
                await send("BOOKMARK", self._bookmark(resource, version, start_revision, initial_end=True))
            for event in backlog:
                await self._send_event(send, event, resource, version, selected, in_scope)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            next_bookmark = loop.time() + self.watch_settings.bookmark_interval
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(next_bookmark - now, 0))
                if getter is None:
                    getter = asyncio.ensure_future(watcher.queue.get())
                done, _ = await asyncio.wait({getter}, timeout=wait)
                if not done:
                    if bookmarks and loop.time() >= next_bookmark:
                        await send("BOOKMARK", self._bookmark(resource, version, self.store.revision))
                        next_bookmark = loop.time() + self.watch_settings.bookmark_interval
                    continue
                live = getter.result()
                getter = None
                if live is None:
                    break
                if since is not None and live.revision <= since:
                    continue
                await self._send_event(send, live, resource, version, selected, in_scope)
        finally:
            if getter is not None:
                getter.cancel()
            if watcher is not None:
                self.store.unwatch(watcher)
        return response

    def _bookmark(
        self, resource: ResourceType, version: str, revision: int, *, initial_end: bool = False
    ) -> JSON:
        meta: JSON = {"resourceVersion": str(revision)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return resource.to_version({"metadata": meta}, version)

    async def _send_event(
        self,
        send: Callable[[str, JSON], Any],
        event: Event,
        resource: ResourceType,
        version: str,
        selected: Callable[[JSON], bool],
        in_scope: Callable[[JSON], bool],
    ) -> None:
        new_ok = in_scope(event.obj) and selected(event.obj)
        old_ok = event.old is not None and in_scope(event.old) and selected(event.old)
        event_type = event.type
        if event_type == "MODIFIED":
            # What the watch cache does when an object moves across the selector's boundary.
            if new_ok and not old_ok:
                event_type = "ADDED"
            elif old_ok and not new_ok:
                event_type = "DELETED"
            elif not new_ok:
                return
        elif not new_ok:
            return
        await send(event_type, resource.to_version(event.obj, version))

    # --- writes: decoding ------------------------------------------------------------------------

    def _validation_directive(self, request: web.Request, options_kind: str) -> str:
        directive = request.query.get("fieldValidation", "")
        if directive and directive not in FIELD_VALIDATION:
            raise _options_invalid(
                options_kind, [_unsupported("fieldValidation", directive, ("Ignore", "Warn", "Strict"))]
            )
        return directive or "Warn"

    def _dry_run(self, request: web.Request, options_kind: str) -> bool:
        values = request.query.getall("dryRun", [])
        for value in values:
            if value != "All":
                raise _options_invalid(options_kind, [_unsupported("dryRun", value, ("All",))])
        return bool(values)

    async def _read_document(self, request: web.Request, allowed: tuple[str, ...]) -> tuple[Any, str]:
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
        if content_type not in allowed:
            raise APIError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: {', '.join(allowed)}",
                reason="UnsupportedMediaType",
            )
        body = await request.read()
        try:
            return parse_body(body, content_type), content_type
        except DecodeError as err:
            raise APIError(400, str(err)) from err

    def _checked(
        self,
        doc: Any,
        resource: ResourceType,
        version: str,
        directive: str,
        *,
        decode_prefix: bool,
    ) -> tuple[JSON, list[str]]:
        """Field-check a versioned document: Strict fails on unknown/duplicate fields, Warn returns them."""
        problems = check_fields(doc, object_schema(resource, version), resource.kind)
        prefix = f"{resource.kind} in version {go_quote(version)} cannot be handled as a {resource.kind}: "
        if problems.type_error:
            raise APIError(400, (prefix if decode_prefix else "") + problems.type_error)
        warnings: list[str] = []
        if problems.unknown:
            if directive == "Strict":
                message = "strict decoding error: " + ", ".join(problems.unknown)
                raise APIError(400, (prefix if decode_prefix else "") + message)
            if directive == "Warn":
                warnings = problems.unknown
        return plain(doc), warnings

    def _body_version(self, doc: JSON, resource: ResourceType, version: str) -> str:
        """Objects may be sent in any served version of the kind; the server converts them."""
        api_version = doc.get("apiVersion")
        kind = doc.get("kind")
        if kind and kind != resource.kind:
            raise APIError(
                400,
                f"{kind} in version {go_quote(_version_of(api_version) or version)} cannot be handled as a "
                f"{resource.kind}: no kind {go_quote(kind)} is registered for version "
                f"{go_quote(api_version or GROUP + '/' + version)}",
            )
        if api_version:
            group, _, body_version = str(api_version).rpartition("/")
            if group != GROUP or body_version not in resource.versions:
                raise APIError(
                    400,
                    f"{resource.kind} in version {go_quote(body_version)} cannot be handled as a {resource.kind}: "
                    f"no kind {go_quote(resource.kind)} is registered for version {go_quote(str(api_version))}",
                )
            return body_version
        return version

    def _scope_namespace(self, internal: JSON, resource: ResourceType, info: RequestInfo) -> None:
        meta = internal["metadata"]
        if not resource.namespaced:
            meta.pop("namespace", None)
            return
        body_ns = meta.get("namespace") or ""
        if body_ns and body_ns != info.namespace:
            raise APIError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = info.namespace

    def _validate(self, resource: ResourceType, internal: JSON) -> None:
        meta = internal["metadata"]
        errs = resource.validate(internal)
        name = meta.get("name") or ""
        if not name and not meta.get("generateName"):
            errs.append(required("metadata.name", "name or generateName is required"))
        elif name:
            errs.extend(invalid("metadata.name", name, msg) for msg in is_valid_path_segment_name(name))
        if meta.get("generateName"):
            errs.extend(
                invalid("metadata.generateName", meta["generateName"], msg)
                for msg in is_valid_path_segment_name(meta["generateName"])
            )
        if resource.namespaced and not meta.get("namespace"):
            errs.append(required("metadata.namespace"))
        if errs:
            raise errors.invalid(resource, name, errs)

    def _admit(self, resource: ResourceType, internal: JSON) -> None:
        """Upstream's BanFlunder admission plugin: fischers list flunder names that may not be created."""
        if resource is not FLUNDERS:
            return
        name = internal["metadata"].get("name", "")
        for fischer in self.store.all_of(FISCHERS.plural):
            if name and name in (fischer.get("disallowedFlunders") or []):
                raise errors.forbidden_admission(
                    resource, name, "this name may not be used, please change the resource name"
                )

    # --- create ----------------------------------------------------------------------------------

    async def _decoded_body(
        self, request: web.Request, resource: ResourceType, version: str, options_kind: str
    ) -> tuple[JSON, list[str], bool]:
        """A create or update body: read, checked against `fieldValidation`, converted to internal.

        Returns (internal object, warnings, dry run).
        """
        directive = self._validation_directive(request, options_kind)
        dry_run = self._dry_run(request, options_kind)
        doc, _ = await self._read_document(request, BODY_TYPES)
        body_version = self._body_version(doc, resource, version) if isinstance(doc, dict) else version
        versioned, warnings = self._checked(doc, resource, body_version, directive, decode_prefix=True)
        return resource.from_version(versioned, body_version), warnings, dry_run

    async def create(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request)
        internal, warnings, dry_run = await self._decoded_body(request, resource, version, "CreateOptions")
        created = self._create_internal(resource, info, internal, dry_run)
        return self._respond_object(request, resource, version, created, 201, warnings, negotiated)

    def _create_internal(
        self, resource: ResourceType, info: RequestInfo, internal: JSON, dry_run: bool
    ) -> JSON:
        self._scope_namespace(internal, resource, info)
        meta = internal["metadata"]
        if meta.get("resourceVersion"):
            raise APIError(400, "resourceVersion should not be set on objects to be created")
        self._admit(resource, internal)
        if not meta.get("name") and meta.get("generateName"):
            base = meta["generateName"]
            if len(base) > 58:
                base = base[:58]
            meta["name"] = base + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
        self._validate(resource, internal)
        name = meta["name"]
        if self.store.get(resource.plural, meta.get("namespace", ""), name) is not None:
            raise errors.already_exists(resource, name)
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["generation"] = 1
        meta["creationTimestamp"] = now_rfc3339()
        if dry_run:
            internal["metadata"] = ordered_metadata(meta)
            return internal
        return self.store.create(resource.plural, internal)

    # --- update / patch --------------------------------------------------------------------------

    async def update(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request)
        internal, warnings, dry_run = await self._decoded_body(request, resource, version, "UpdateOptions")
        body_name = internal["metadata"].get("name") or ""
        if body_name != info.name:
            raise APIError(
                400, f"the name of the object ({body_name}) does not match the name on the URL ({info.name})"
            )
        current = self._existing(resource, info)
        if not internal["metadata"].get("resourceVersion"):
            raise errors.invalid(
                resource,
                info.name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        "Invalid value",
                        "must be specified for an update",
                        "0x0",
                        True,
                        quote=False,
                    )
                ],
            )
        updated, status = self._update_internal(resource, info, current, internal, dry_run)
        return self._respond_object(request, resource, version, updated, status, warnings, negotiated)

    def _update_internal(
        self, resource: ResourceType, info: RequestInfo, current: JSON, internal: JSON, dry_run: bool
    ) -> tuple[JSON, int]:
        self._scope_namespace(internal, resource, info)
        meta, old_meta = internal["metadata"], current["metadata"]
        requested_rv = meta.get("resourceVersion")
        if requested_rv and requested_rv != old_meta.get("resourceVersion"):
            raise errors.conflict(resource, info.name, errors.OPTIMISTIC_LOCK)
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            raise errors.invalid(
                resource, info.name, [invalid("metadata.uid", meta["uid"], "field is immutable")]
            )
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta.pop("selfLink", None)
        meta["name"] = info.name
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise errors.invalid(
                    resource,
                    info.name,
                    [
                        FieldError(
                            "metadata.finalizers",
                            "Forbidden",
                            "no new finalizers can be added if the object is being deleted",
                        )
                    ],
                )
        self._validate(resource, internal)
        if _content(internal) != _content(current):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if internal == current:
            return current, 200  # no-op updates do not bump the resourceVersion
        if dry_run:
            return internal, 200
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self.store.delete(resource.plural, info.namespace, info.name, internal), 200
        return self.store.update(resource.plural, internal), 200

    async def patch(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request)
        directive = self._validation_directive(request, "PatchOptions")
        dry_run = self._dry_run(request, "PatchOptions")
        patch_doc, patch_type = await self._read_document(request, PATCH_TYPES)
        if patch_type == "application/apply-patch+yaml":
            return await self._apply(
                request, info, resource, version, patch_doc, directive, dry_run, negotiated
            )
        current = self._existing(resource, info)
        original = resource.to_version(current, version)
        try:
            if patch_type == "application/json-patch+json":
                patched = json_patch(original, plain(patch_doc))
            elif patch_type == "application/merge-patch+json":
                patched = merge_patch(original, plain(patch_doc))
            else:
                patched = strategic_merge_patch(original, plain(patch_doc))
        except PatchError as err:
            if err.code == 400:
                raise APIError(400, str(err)) from err
            raise APIError(
                422,
                "the server rejected our request due to an error in our request",
                reason="Invalid",
                details={"causes": [{"reason": "UnexpectedServerResponse", "message": str(err)}]},
            ) from err
        versioned, warnings = self._checked(patched, resource, version, directive, decode_prefix=False)
        versioned["kind"], versioned["apiVersion"] = resource.kind, f"{GROUP}/{version}"
        internal = resource.from_version(versioned, version)
        meta = internal["metadata"]
        if meta.get("name") != info.name:
            raise APIError(
                400,
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({info.name})",
            )
        if not meta.get("resourceVersion"):
            meta["resourceVersion"] = current["metadata"].get("resourceVersion")
        updated, status = self._update_internal(resource, info, current, internal, dry_run)
        return self._respond_object(request, resource, version, updated, status, warnings, negotiated)

    async def _apply(
        self,
        request: web.Request,
        info: RequestInfo,
        resource: ResourceType,
        version: str,
        applied: Any,
        directive: str,
        dry_run: bool,
        negotiated: Negotiated,
    ) -> web.Response:
        """Server-side apply, simplified: create when missing, else merge the applied configuration.

        There is no field ownership tracking: fields dropped from a later apply are not removed
        and conflicts between managers are not detected.
        """
        if not request.query.get("fieldManager"):
            raise _options_invalid("PatchOptions", [required("fieldManager", "is required for apply patch")])
        if not isinstance(applied, dict):
            raise APIError(400, "error decoding YAML: the apply patch must be an object")
        body_version = self._body_version(applied, resource, version)
        versioned, warnings = self._checked(applied, resource, body_version, directive, decode_prefix=False)
        if not versioned.get("kind") or not versioned.get("apiVersion"):
            raise APIError(400, "invalid object type: /, Kind=")
        current = self.store.get(resource.plural, info.namespace, info.name)
        if current is None:
            internal = resource.from_version(versioned, body_version)
            if (internal["metadata"].get("name") or "") != info.name:
                raise APIError(
                    400,
                    f"the name of the object ({internal['metadata'].get('name', '')}) does not match the name on the URL ({info.name})",
                )
            created = self._create_internal(resource, info, internal, dry_run)
            return self._respond_object(request, resource, version, created, 201, warnings, negotiated)
        original = resource.to_version(current, body_version)
        patched = merge_patch(original, versioned)
        internal = resource.from_version(patched, body_version)
        internal["metadata"]["resourceVersion"] = versioned.get("metadata", {}).get(
            "resourceVersion"
        ) or current["metadata"].get("resourceVersion")
        updated, status = self._update_internal(resource, info, current, internal, dry_run)
        return self._respond_object(request, resource, version, updated, status, warnings, negotiated)

    # --- delete ----------------------------------------------------------------------------------

    async def _delete_options(self, request: web.Request) -> JSON:
        body = await request.read()
        if not body.strip():
            return {}
        try:
            options = parse_body(body, "application/json")
        except DecodeError as err:
            raise APIError(400, str(err)) from err
        if not isinstance(options, dict):
            raise APIError(400, "json: cannot unmarshal into Go value of type v1.DeleteOptions")
        result: JSON = plain(options)
        return result

    def _delete_one(
        self, resource: ResourceType, current: JSON, preconditions: JSON, dry_run: bool
    ) -> tuple[JSON, bool]:
        """Delete now, or mark for deletion while finalizers remain. Returns (object, deleted)."""
        meta = current["metadata"]
        name = meta["name"]
        uid = preconditions.get("uid")
        if uid and uid != meta.get("uid"):
            raise errors.conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid', '')}",
            )
        rv = preconditions.get("resourceVersion")
        if rv and rv != meta.get("resourceVersion"):
            raise errors.conflict(
                resource,
                name,
                f"Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: "
                f"{meta.get('resourceVersion', '')}",
            )
        if dry_run:
            return current, not meta.get("finalizers")
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_rfc3339()
                meta["deletionGracePeriodSeconds"] = 0
                current = self.store.update(resource.plural, current)
            return current, False
        return self.store.delete(resource.plural, meta.get("namespace", ""), name), True

    async def delete(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request, allow_table=False)
        dry_run = self._dry_run(request, "DeleteOptions")
        options = await self._delete_options(request)
        current = self._existing(resource, info)
        obj, deleted = self._delete_one(resource, current, options.get("preconditions") or {}, dry_run)
        if not deleted:
            return self._respond_object(request, resource, version, obj, 200, negotiated=negotiated)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": info.name,
                "group": GROUP,
                "kind": resource.plural,
                "uid": obj["metadata"].get("uid", ""),
            },
        }
        return self._write(request, status, negotiated)

    async def delete_collection(
        self, request: web.Request, info: RequestInfo, resource: ResourceType, version: str
    ) -> web.Response:
        negotiated = self._negotiate(request, allow_table=False)
        dry_run = self._dry_run(request, "DeleteOptions")
        options = await self._delete_options(request)
        selected = self._predicate(request)
        namespace = info.namespace if resource.namespaced and info.namespace else None
        items = []
        for obj in self.store.list_objects(resource.plural, namespace):
            if selected(obj):
                result, _ = self._delete_one(resource, obj, options.get("preconditions") or {}, dry_run)
                items.append(resource.to_version(result, version))
        body = {
            "kind": resource.list_kind,
            "apiVersion": f"{GROUP}/{version}",
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }
        return self._write(request, body, negotiated)


def _content(obj: JSON) -> JSON:
    """Everything but metadata: what `generation` tracks."""
    return {k: v for k, v in obj.items() if k != "metadata"}


def _version_of(api_version: Any) -> str:
    return str(api_version).rpartition("/")[2] if api_version else ""


def _parse_int(text: str, name: str) -> int:
    if not text:
        return 0
    try:
        return int(text)
    except ValueError as err:
        raise APIError(400, f"{name}: Invalid value: {go_quote(text)}: must be an integer") from err


def _parse_resource_version(text: str) -> int | None:
    if not text:
        return None
    try:
        value = int(text)
    except ValueError as err:
        raise APIError(400, f"invalid resource version: {go_quote(text)}") from err
    if value < 0:
        raise APIError(400, f"invalid resource version: {go_quote(text)}")
    return value


def _sort_key(obj: JSON) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _encode_continue(revision: int, start: str) -> str:
    token = json.dumps(
        {"v": "meta.k8s.io/v1", "rv": revision, "start": start + "\x00"}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> str | None:
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        start = data["start"]
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(start, str):
            raise ValueError("unsupported continue token")
    except (ValueError, KeyError, TypeError) as err:
        raise APIError(
            400, "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ) from err
    return start.rstrip("\x00")
