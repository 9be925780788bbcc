"""Legacy discovery: `/apis` (APIGroupList) and `/apis/<group>` (APIGroup), as kube-aggregator serves them.

`apiregistration.k8s.io` always comes first (hard-coded upstream, never from an APIService), then
every APIService group except the core group, available or not, local or remote, in
`SortedByGroupAndVersion` order, except those in discovery quarantine (`availability/quarantine.py`:
opt-in, for groups that store nothing; a group whose every version is quarantined answers 404 at
`/apis/<group>`). The documents are rebuilt when the store changes (a burst of events
is coalesced into one rebuild) and served from pre-rendered bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aggregator.contracts import Quarantined
from aggregator.discovery.ordering import sort_group_versions, sorted_by_group_and_version
from aggregator.model.apiservice import API_VERSION as REGISTRATION_GROUP_VERSION
from aggregator.model.apiservice import GROUP as REGISTRATION_GROUP
from aggregator.model.apiservice import VERSION as REGISTRATION_VERSION
from aggregator.model.apiservice import APIService
from aggregator.sources.store import ADDED, DELETED, Event, Kind, Store
from aggregator.util.coalesce import Throttled
from aggregator.web.context import RequestContext
from aggregator.web.rendering import not_acceptable, respond
from aggregator.web.responses import not_found
from aggregator.web.serverrequest import Response
from aggregator.wire.negotiation import Negotiator, default_restriction
from aggregator.wire.rendered import Rendered

log = logging.getLogger(__name__)

# kube-apiserver's generic filter sets this on every response that has none; the ETag we add is
# compatible with it (no-cache means "revalidate", which is what If-None-Match does).
LEGACY_HEADERS = {"Cache-Control": "no-cache, private", "Vary": "Accept"}
# At most one re-render of the whole list per this many seconds (a read in between renders it).
RENDER_INTERVAL = 0.25


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
    """Pre-rendered `/apis` and `/apis/<group>` documents, kept in step with the store.

    Spec changes of an APIService re-render its group's APIGroup at once (a few members) and mark
    the whole list stale; the list is re-rendered once per burst of changes (`Throttled`), or on
    the next read if that comes first. Status-only changes (availability verdicts) touch neither.
    Until the list is first read, nothing is rendered ahead: the control process of `--workers N`
    serves no request, and rendering 5000 groups on every change held up its event loop (the
    checks of the APIService just added among them) for a few hundred milliseconds each time.
    """

    def __init__(
        self, store: Store, *, interval: float = RENDER_INTERVAL, quarantine: Quarantined | None = None
    ) -> None:
        self.store = store
        self.quarantine = quarantine
        self.negotiate = Negotiator(default_restriction)
        self._members: dict[str, dict[str, APIService]] = {}
        # None: every version of the group is quarantined (registered, but not listed).
        self._groups: dict[str, Rendered | None] = {}
        self._group_list: Rendered | None = None
        self._read = False  # the list was asked for: re-render it ahead from now on
        self.rebuilds = 0
        self._render = Throttled(self._render_group_list, interval=interval, name="legacy-discovery")
        for svc in store.apiservices():
            self._add(svc)

    # --- keeping up with the store --------------------------------------------------------------

    def on_store_event(self, event: Event) -> None:
        if event.kind is not Kind.APISERVICE or event.status_only:
            return
        old, new = event.old, event.obj
        changed: set[str] = set()
        if isinstance(old, APIService) and event.type != ADDED:
            changed.add(self._remove(old))
        if event.type != DELETED and isinstance(new, APIService):
            changed.add(self._add(new))
        for group in changed:
            self._render_group(group)
        self._stale()

    def _stale(self) -> None:
        self._group_list = None
        if self._read:
            self._render.request()

    def _add(self, svc: APIService) -> str:
        if svc.group:
            self._members.setdefault(svc.group, {})[svc.name] = svc
        return svc.group

    def _remove(self, svc: APIService) -> str:
        members = self._members.get(svc.group)
        if members is not None:
            members.pop(svc.name, None)
            if not members:
                del self._members[svc.group]
        return svc.group

    def quarantine_changed(self, name: str) -> None:
        """An APIService entered or left discovery quarantine: its group and the list change."""
        svc = self.store.apiservice(name)
        if svc is not None and svc.group:
            self._render_group(svc.group)
        self._stale()

    def _hidden(self) -> frozenset[str]:
        return self.quarantine.quarantined if self.quarantine is not None else frozenset()

    def _render_group(self, group: str) -> None:
        members = self._members.get(group)
        if members:
            hidden = self._hidden()
            shown = [svc for svc in members.values() if svc.name not in hidden]
            self._groups[group] = Rendered.of(group_document(shown)) if shown else None
        else:
            self._groups.pop(group, None)

    def _render_group_list(self) -> None:
        if self._group_list is None:
            hidden = self._hidden()
            apiservices = self.store.apiservices()
            if hidden:
                apiservices = [svc for svc in apiservices if svc.name not in hidden]
            self._group_list = Rendered.of(group_list_document(apiservices))
            self.rebuilds += 1
            log.debug("legacy discovery rebuilt", extra={"fields": {"groups": len(self._members)}})

    # --- reads ----------------------------------------------------------------------------------

    def has_group(self, group: str) -> bool:
        return group in self._members

    def group_list(self) -> Rendered:
        self._read = True
        self._render_group_list()
        assert self._group_list is not None
        return self._group_list

    def group(self, name: str) -> Rendered | None:
        """The group's APIGroup; None when it is not registered or all of it is quarantined."""
        if name in self._members and name not in self._groups:
            self._render_group(name)
        return self._groups.get(name)

    # --- HTTP -----------------------------------------------------------------------------------

    def serve_group_list(self, ctx: RequestContext) -> Response:
        media = self.negotiate(ctx.headers.get("Accept", ""))
        if media is None:
            return not_acceptable()
        return respond(ctx, self.group_list(), media, headers=LEGACY_HEADERS)

    def serve_group(self, ctx: RequestContext, name: str) -> Response | None:
        """The APIGroup, a 406, a 404 when every version of it is quarantined (kube-apiserver behind
        would list it), or None when the group is not registered (the caller falls back)."""
        rendered = self.group(name)
        if rendered is None:
            return not_found(ctx) if name in self._members else None
        media = self.negotiate(ctx.headers.get("Accept", ""))
        if media is None:
            return not_acceptable()
        return respond(ctx, rendered, media, headers=LEGACY_HEADERS)
