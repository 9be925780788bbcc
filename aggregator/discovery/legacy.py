"""Legacy discovery: `/apis` (APIGroupList) and `/apis/<group>` (APIGroup), as kube-aggregator serves them.

`apiregistration.k8s.io` always comes first (hard-coded upstream, never from an APIService), then
every APIService group except the core group, available or not, local or remote, in
`SortedByGroupAndVersion` order. The documents are rebuilt when the store changes (a burst of events
is coalesced into one rebuild) and served from pre-rendered bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from aggregator.discovery.ordering import sort_group_versions, sorted_by_group_and_version
from aggregator.model.apiservice import API_VERSION as REGISTRATION_GROUP_VERSION
from aggregator.model.apiservice import GROUP as REGISTRATION_GROUP
from aggregator.model.apiservice import VERSION as REGISTRATION_VERSION
from aggregator.model.apiservice import APIService
from aggregator.sources.store import Event, Kind, Store
from aggregator.wire.negotiation import Negotiator, default_restriction
from aggregator.wire.rendered import Rendered, not_acceptable, respond

log = logging.getLogger(__name__)

# kube-apiserver's generic filter sets this on every response that has none; the ETag we add is
# compatible with it (no-cache means "revalidate", which is what If-None-Match does).
LEGACY_HEADERS = {"Cache-Control": "no-cache, private", "Vary": "Accept"}


def _version_entry(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}" if group else version, "version": version}


REGISTRATION_API_GROUP: dict[str, Any] = {
    "name": REGISTRATION_GROUP,
    "versions": [_version_entry(REGISTRATION_GROUP, REGISTRATION_VERSION)],
    "preferredVersion": _version_entry(REGISTRATION_GROUP, REGISTRATION_VERSION),
}
assert REGISTRATION_API_GROUP["versions"][0]["groupVersion"] == REGISTRATION_GROUP_VERSION


def api_group(members: Iterable[APIService]) -> dict[str, Any]:
    """`convertToDiscoveryAPIGroup`: one group's APIServices, preferred version first."""
    ordered = sort_group_versions(members)
    versions = [_version_entry(svc.group, svc.version) for svc in ordered]
    return {"name": ordered[0].group, "versions": versions, "preferredVersion": versions[0]}


def group_list_document(apiservices: Iterable[APIService]) -> dict[str, Any]:
    """The APIGroupList kube-aggregator serves at `/apis` for these APIServices."""
    groups = [REGISTRATION_API_GROUP]
    groups.extend(
        api_group(members) for members in sorted_by_group_and_version(apiservices) if members[0].group
    )
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group_document(members: Iterable[APIService]) -> dict[str, Any]:
    """The APIGroup kube-aggregator serves at `/apis/<group>`."""
    return {"kind": "APIGroup", "apiVersion": "v1", **api_group(members)}


class LegacyDiscovery:
    """Pre-rendered `/apis` and `/apis/<group>` documents, kept in step with the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.negotiate = Negotiator(default_restriction)
        self._group_list: Rendered | None = None
        self._groups: dict[str, Rendered] = {}
        self._group_names: frozenset[str] = frozenset()
        self._dirty = True
        self._rebuild_scheduled = False
        self.rebuilds = 0
        self._refresh_names()
        store.add_listener(self._on_event)

    # --- keeping up with the store --------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE:
            return
        self._dirty = True
        self._refresh_names()
        if self._rebuild_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a unit test driving the store): the next read rebuilds
        self._rebuild_scheduled = True
        loop.call_soon(self._scheduled_rebuild)

    def _refresh_names(self) -> None:
        self._group_names = frozenset(svc.group for svc in self.store.apiservices() if svc.group)

    def _scheduled_rebuild(self) -> None:
        self._rebuild_scheduled = False
        if self._dirty:
            self._rebuild()

    def _rebuild(self) -> None:
        apiservices = self.store.apiservices()
        by_group: dict[str, list[APIService]] = {}
        for svc in apiservices:
            if svc.group:
                by_group.setdefault(svc.group, []).append(svc)
        self._group_list = Rendered.of(group_list_document(apiservices))
        self._groups = {group: Rendered.of(group_document(members)) for group, members in by_group.items()}
        self._dirty = False
        self.rebuilds += 1
        log.debug("legacy discovery rebuilt", extra={"fields": {"groups": len(by_group)}})

    # --- reads ----------------------------------------------------------------------------------

    def has_group(self, group: str) -> bool:
        return group in self._group_names

    def group_list(self) -> Rendered:
        if self._dirty or self._group_list is None:
            self._rebuild()
        assert self._group_list is not None
        return self._group_list

    def group(self, name: str) -> Rendered | None:
        if self._dirty:
            self._rebuild()
        return self._groups.get(name)

    # --- HTTP -----------------------------------------------------------------------------------

    def serve_group_list(self, request: web.Request) -> web.Response:
        media = self.negotiate(request.headers.get("Accept", ""))
        if media is None:
            return not_acceptable()
        return respond(request, self.group_list(), media, headers=LEGACY_HEADERS)

    def serve_group(self, request: web.Request, name: str) -> web.Response | None:
        """The APIGroup, a 406, or None when the group is not registered (the caller falls back)."""
        rendered = self.group(name)
        if rendered is None:
            return None
        media = self.negotiate(request.headers.get("Accept", ""))
        if media is None:
            return not_acceptable()
        return respond(request, rendered, media, headers=LEGACY_HEADERS)
