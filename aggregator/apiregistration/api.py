"""Local mode's `apiregistration.k8s.io/v1`: the store's APIServices served read-only, like kube-apiserver.

`/apis` lists `apiregistration.k8s.io` first (as upstream always does), so in local mode the gateway
serves that group itself: its APIGroup and APIResourceList, and list, get and watch of the APIServices
it holds, with their current conditions. `kubectl get apiservices` (Table output), `-o yaml`, `-w`
and metadata-only clients work. Writes answer 405: the folder is the source of truth. In kube mode
this group belongs to kube-apiserver and none of this is installed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict

from aggregator.apiregistration.documents import (
    API_GROUP,
    API_VERSION,
    COLUMNS,
    DEFAULT_WATCH_SECONDS,
    GROUP,
    HEADERS,
    META_GROUP,
    PREFIX,
    QUALIFIED,
    RESOURCE,
    RESOURCE_LIST,
    VERSION,
    content_type,
    encode,
    encode_apiservice,
    error_response,
    partial_metadata,
    resource_restriction,
    table_row,
)
from aggregator.apiregistration.selectors import matches
from aggregator.model import apiservice as model
from aggregator.model.apiservice import APIService
from aggregator.sources.store import ADDED, Event, Kind, Store
from aggregator.web.context import RequestContext
from aggregator.web.rendering import respond
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.serverrequest import Answer, Response
from aggregator.wire.jsonenc import encode_object
from aggregator.wire.negotiation import JSON, MediaType, Negotiator, not_acceptable_body
from aggregator.wire.rendered import Rendered

log = logging.getLogger(__name__)


@dataclass
class _Identity:
    uid: str
    created: str


# An object whose manifest carries both: `encode_apiservice` serves the manifest's (`setdefault`).
_IN_MANIFEST = _Identity("", "")


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

    def install(self, router: Router) -> None:
        router.add_exact(f"/apis/{GROUP}", Route(self.serve_group, RouteKind.OWN, "apiregistration"))
        router.add_exact(f"/apis/{GROUP}/", Route(self.serve_group, RouteKind.OWN, "apiregistration"))
        resources = Route(self.serve_resource_list, RouteKind.OWN, "apiregistration")
        router.add_exact(f"/apis/{API_VERSION}", resources)
        router.add_exact(f"/apis/{API_VERSION}/", resources)
        router.add_prefix(PREFIX, Route(self.serve_apiservices, RouteKind.OWN, "apiregistration"))

    # --- identities and history -------------------------------------------------------------------

    def _identify(self, svc: APIService) -> _Identity:
        """The uid and creationTimestamp the object is served with: its manifest's when it holds
        both (the folder source sets them, `sources/identity.py`; nothing is kept per object then),
        else made up here once per object."""
        metadata = svc.raw.get("metadata")
        if isinstance(metadata, Mapping) and metadata.get("uid") and metadata.get("creationTimestamp"):
            return _IN_MANIFEST
        identity = self._identities.get(svc.name)
        if identity is None:
            identity = _Identity(str(uuid.uuid4()), model.now_rfc3339())
            self._identities[svc.name] = identity
        return identity

    def on_store_event(self, event: Event) -> None:
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

    async def serve_group(self, ctx: RequestContext) -> Answer:
        return self._serve_static(ctx, self._group)

    async def serve_resource_list(self, ctx: RequestContext) -> Answer:
        return self._serve_static(ctx, self._resources)

    def _serve_static(self, ctx: RequestContext, rendered: Rendered) -> Answer:
        media = self._negotiate_plain(ctx.headers.get("Accept", ""))
        if media is None:
            return Response(406, not_acceptable_body(), content_type=JSON)
        return respond(ctx, rendered, media, headers=HEADERS)

    async def serve_apiservices(self, ctx: RequestContext) -> Answer:
        parts = ctx.path[len(PREFIX) :].rstrip("/").split("/")
        if len(parts) < 2 or parts[0] != VERSION or parts[1] != RESOURCE or len(parts) > 4:
            return error_response(ctx, 404, "the server could not find the requested resource", {})
        name = parts[2] if len(parts) >= 3 else None
        sub = parts[3] if len(parts) == 4 else None
        if sub is not None and sub != "status":
            return error_response(ctx, 404, "the server could not find the requested resource", {})
        if ctx.method not in ("GET", "HEAD"):
            return self._method_not_allowed(ctx, name)
        media = self._negotiate_resource(ctx.headers.get("Accept", ""))
        if media is None:
            return Response(406, not_acceptable_body(), content_type=JSON)
        if name is None:
            if ctx.query_value("watch") in ("1", "true", "True", "t", "T", "TRUE"):
                return await self._watch(ctx, media)
            return self._list(ctx, media)
        return self._get(ctx, media, name)

    def _method_not_allowed(self, ctx: RequestContext, name: str | None) -> Response:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(ctx.method, "")
        if ctx.method == "DELETE":
            verb = "delete" if name else "deletecollection"
        verb = verb or ctx.method.lower()
        message = (
            f'{verb} is not supported on resources of kind "{QUALIFIED}": this gateway serves APIServices '
            "read-only from its --apiservices-dir"
        )
        log.info(
            "refused a write to apiservices", extra={"fields": {"method": ctx.method, "name": name or ""}}
        )
        return error_response(ctx, 405, message, {"group": GROUP, "kind": RESOURCE})

    def _selected(self, ctx: RequestContext) -> list[APIService] | Response:
        items = sorted(self.store.apiservices(), key=lambda s: s.name)
        try:
            return [
                s
                for s in items
                if matches(s, ctx.query_value("labelSelector"), ctx.query_value("fieldSelector"))
            ]
        except ValueError as err:
            return error_response(ctx, 400, str(err))

    def _list(self, ctx: RequestContext, media: MediaType) -> Response:
        selected = self._selected(ctx)
        if isinstance(selected, Response):
            return selected
        revision = str(self.store.revision)
        objects = [(self.encode(s), s) for s in selected]
        kind = media.convert.kind if media.convert is not None else None
        if kind == "PartialObjectMetadata":
            return _not_convertible(ctx, kind, "a list (*v1.APIServiceList)")
        doc: dict[str, Any]
        if kind == "Table":
            assert media.convert is not None
            doc = self._table(ctx, media.convert.version, objects, revision)
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
        return Response(200, encode(doc, media, ctx), {"Content-Type": content_type(media), **HEADERS})

    def _get(self, ctx: RequestContext, media: MediaType, name: str) -> Response:
        svc = self.store.apiservice(name)
        if svc is None:
            return error_response(
                ctx,
                404,
                f'{QUALIFIED} "{name}" not found',
                {"name": name, "group": GROUP, "kind": RESOURCE},
            )
        obj = self.encode(svc)
        kind = media.convert.kind if media.convert is not None else None
        if kind == "PartialObjectMetadataList":
            return _not_convertible(ctx, kind, "not a list (*v1.APIService)")
        if kind == "Table":
            assert media.convert is not None
            doc = self._table(ctx, media.convert.version, [(obj, svc)], svc.resource_version)
        elif kind == "PartialObjectMetadata":
            assert media.convert is not None
            doc = partial_metadata(obj, media.convert.version)
        else:
            doc = obj
        return Response(200, encode(doc, media, ctx), {"Content-Type": content_type(media), **HEADERS})

    def _table(
        self,
        ctx: RequestContext,
        meta_version: str,
        objects: Iterable[tuple[dict[str, Any], APIService]],
        revision: str,
    ) -> dict[str, Any]:
        include = ctx.query_value("includeObject") or "Metadata"
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

    async def _watch(self, ctx: RequestContext, media: MediaType) -> Answer:
        label, field = ctx.query_value("labelSelector"), ctx.query_value("fieldSelector")
        try:
            matches(None, label, field)
        except ValueError as err:
            return error_response(ctx, 400, str(err))
        since = ctx.query_value("resourceVersion")
        timeout = DEFAULT_WATCH_SECONDS
        with contextlib.suppress(ValueError):
            timeout = float(ctx.query_value("timeoutSeconds")) or timeout
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
                return error_response(
                    ctx, 400, f'resourceVersion: Invalid value: "{since}": must be an integer'
                )
            if start < self._compacted_through:
                subscription.close()
                oldest = self._history[0].revision if self._history else self.store.revision
                return error_response(ctx, 410, f"too old resource version: {start} ({oldest})")
            for event in self._history:
                if event.revision > start and isinstance(event.obj, APIService):
                    initial.append((event.type, event.obj))
        response = await ctx.request.stream(
            200, CIMultiDict({"Content-Type": content_type(media), **HEADERS})
        )
        try:
            async with asyncio.timeout(timeout):
                for kind, svc in initial:
                    if matches(svc, label, field):
                        await response.write(self._watch_line(kind, svc, media, ctx))
                async for event in subscription:
                    obj = event.obj
                    if isinstance(obj, APIService) and matches(obj, label, field):
                        await response.write(self._watch_line(event.type, obj, media, ctx))
        except TimeoutError:
            pass
        except (ConnectionResetError, asyncio.CancelledError):
            subscription.close()
            raise
        finally:
            subscription.close()
        with contextlib.suppress(ConnectionResetError):
            await response.finish()
        return response

    def _watch_line(self, kind: str, svc: APIService, media: MediaType, ctx: RequestContext) -> bytes:
        obj: dict[str, Any] = self.encode(svc)
        convert = media.convert
        if convert is not None and convert.kind == "Table":
            obj = self._table(ctx, convert.version, [(obj, svc)], svc.resource_version)
        elif convert is not None and convert.kind.startswith("PartialObjectMetadata"):
            obj = partial_metadata(obj, convert.version)
        return encode_object({"type": kind, "object": obj})


def _not_convertible(ctx: RequestContext, kind: str, shape: str) -> Response:
    """kube-apiserver's 406 when a list is asked for as one object's metadata or an object as a
    list's (apiserver's handlers/response.go `asPartialObjectMetadata(List)`)."""
    return error_response(ctx, 406, f"you requested {kind}, but the requested object is {shape}")
