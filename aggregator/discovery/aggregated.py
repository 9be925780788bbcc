"""Aggregated discovery (`apidiscovery.k8s.io/v2` APIGroupDiscoveryList): merge, order, render, serve.

Inputs are per group-version entries, each with its priorities and (maybe) resources: the gateway's
own `apiregistration.k8s.io/v1` (pinned first at 20001), remote APIServices with the priorities of
their spec and the resources their backend last served, and kube-apiserver's own groups with the
built-in priority table (CRD groups 1000/100, anything else 1000/15). Groups are ordered by their
highest groupPriorityMinimum, ties by group NAME (unlike legacy `/apis`); versions by
versionPriority, then kube-aware order.

Freshness goes beyond upstream: a backend that starts failing keeps its last good resources, marked
`Stale`; a backend never reached is `Stale` with no resources. The document is rendered once per
change (v2 and v2beta1, JSON, indented JSON, YAML) with upstream's ETag.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources as package_resources
from typing import Any

from aggregator.model.versions import version_sort_key
from aggregator.util.coalesce import Throttled
from aggregator.web.context import RequestContext
from aggregator.web.rendering import respond
from aggregator.web.serverrequest import Response
from aggregator.wire.jsonenc import go_marshal
from aggregator.wire.negotiation import DISCOVERY_GROUP, DISCOVERY_KIND, MediaType
from aggregator.wire.rendered import ParsedLater, Rendered, quoted_sha512

log = logging.getLogger(__name__)

CURRENT, STALE = "Current", "Stale"
REGISTRATION_GROUP_PRIORITY = 20001
DEFAULT_PRIORITY = (1000, 15)
CRD_PRIORITY = (1000, 100)
HEADERS = {"Vary": "Accept", "Cache-Control": "public"}
# At most one re-render per this many seconds while changes pour in (a read in between renders).
RENDER_INTERVAL = 0.25

# What kube-apiserver publishes for its own apiregistration.k8s.io/v1 (its aggregated `/apis`), with
# local mode's read-only verbs (writes answer 405 there: the folder is the source of truth).
_APISERVICE_KIND = {"group": "", "version": "", "kind": "APIService"}
REGISTRATION_RESOURCES: list[dict[str, Any]] = [
    {
        "resource": "apiservices",
        "responseKind": _APISERVICE_KIND,
        "scope": "Cluster",
        "singularResource": "apiservice",
        "verbs": ["get", "list", "watch"],
        "categories": ["api-extensions"],
        "subresources": [{"subresource": "status", "responseKind": _APISERVICE_KIND, "verbs": ["get"]}],
    }
]


def load_builtin_priorities() -> dict[str, tuple[int, int]]:
    """`group/version` -> (groupPriorityMinimum, versionPriority) for kube-apiserver's built-in groups."""
    text = package_resources.files("aggregator.model").joinpath("priorities.json").read_text()
    table = json.loads(text)["priorities"]
    return {gv: (p["groupPriorityMinimum"], p["versionPriority"]) for gv, p in table.items()}


# --- normalizing backend documents into Go's struct shapes --------------------------------------------


def _gvk(value: Any) -> dict[str, str]:
    """A `*GroupVersionKind`; nil becomes `{}`-valued fields (upstream's client-go 0.26 workaround)."""
    value = value if isinstance(value, Mapping) else {}
    return {k: str(value.get(k) or "") for k in ("group", "version", "kind")}


def _strings(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None


def normalize_subresource(sub: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "subresource": str(sub.get("subresource") or ""),
        "responseKind": _gvk(sub.get("responseKind")),
    }
    accepted = sub.get("acceptedTypes")
    if isinstance(accepted, list) and accepted:
        out["acceptedTypes"] = [_gvk(t) for t in accepted]
    out["verbs"] = _strings(sub.get("verbs"))
    return out


def _add_names(out: dict[str, Any], res: Mapping[str, Any]) -> None:
    """`shortNames` and `categories`, after the verbs and only when not empty (omitempty); the
    aggregated and the legacy resource call them the same."""
    for key in ("shortNames", "categories"):
        values = _strings(res.get(key))
        if values:
            out[key] = values


def normalize_resource(res: Mapping[str, Any]) -> dict[str, Any]:
    """APIResourceDiscovery with Go's field order and omitempty rules, unknown fields dropped."""
    out: dict[str, Any] = {
        "resource": str(res.get("resource") or ""),
        "responseKind": _gvk(res.get("responseKind")),
        "scope": str(res.get("scope") or ""),
        "singularResource": str(res.get("singularResource") or ""),
        "verbs": _strings(res.get("verbs")),
    }
    _add_names(out, res)
    subs = res.get("subresources")
    if isinstance(subs, list) and subs:
        out["subresources"] = [normalize_subresource(s) for s in subs if isinstance(s, Mapping)]
    return out


class ConversionError(ValueError):
    """A legacy APIResourceList that cannot be expressed as aggregated discovery."""


def convert_resource_list(resources: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """apiserver `ConvertGroupVersionIntoToDiscovery`: a legacy APIResourceList's resources, aggregated."""
    out: list[dict[str, Any]] = []
    parents: dict[str, int] = {}
    for r in resources:
        name = str(r.get("name") or "")
        if "/" in name:
            continue
        resource: dict[str, Any] = {
            "resource": name,
            "responseKind": {
                "group": str(r.get("group") or ""),
                "version": str(r.get("version") or ""),
                "kind": str(r.get("kind") or ""),
            },
            "scope": "Namespaced" if r.get("namespaced") else "Cluster",
            "singularResource": str(r.get("singularName") or ""),
            "verbs": _strings(r.get("verbs")),
        }
        _add_names(resource, r)
        out.append(resource)
        parents[name] = len(out) - 1
    for r in resources:
        name = str(r.get("name") or "")
        if "/" not in name:
            continue
        parent, sub = name.split("/", 1)
        scope = "Namespaced" if r.get("namespaced") else "Cluster"
        index = parents.get(parent)
        if index is None:
            out.append(
                {
                    "resource": parent,
                    "responseKind": _gvk(None),
                    "scope": scope,
                    "singularResource": "",
                    "verbs": None,
                }
            )
            index = parents[parent] = len(out) - 1
        if out[index]["scope"] != scope:
            raise ConversionError(
                f"Error: Parent {parent} (scope: {out[index]['scope']}) and subresource {sub} (scope: {scope}) scope do not match"
            )
        kind = str(r.get("kind") or "")
        response_kind = (
            {"group": str(r.get("group") or ""), "version": str(r.get("version") or ""), "kind": kind}
            if kind
            else _gvk(None)
        )
        out[index].setdefault("subresources", []).append(
            {"subresource": sub, "responseKind": response_kind, "verbs": _strings(r.get("verbs"))}
        )
    # Go's field order puts subresources last; setdefault appended it after any optional fields.
    return out


# --- merge and order -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionEntry:
    """One group-version of the document, with the priorities that place it."""

    group: str
    version: str
    group_priority: int
    version_priority: int
    resources: tuple[Mapping[str, Any], ...] | None  # None: nothing known (never fetched)
    freshness: str = CURRENT

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version}
        if self.resources:
            out["resources"] = list(self.resources)
        if self.freshness:
            out["freshness"] = self.freshness
        return out


def registration_entry() -> VersionEntry:
    return VersionEntry(
        "apiregistration.k8s.io", "v1", REGISTRATION_GROUP_PRIORITY, 0, tuple(REGISTRATION_RESOURCES)
    )


def group_metadata(name: str) -> dict[str, Any]:
    """A group's `metadata` as kube-apiserver >= 1.34 writes it (the core group's name is empty)."""
    return {"name": name} if name else {}


def order_groups(entries: Iterable[VersionEntry]) -> list[tuple[str, list[VersionEntry]]]:
    """Groups by (highest priority desc, name), each group's versions by (vp desc, kube-aware)."""
    by_group: dict[str, dict[str, VersionEntry]] = {}
    for entry in entries:
        # The first entry for a group-version wins (callers list the authoritative source first).
        by_group.setdefault(entry.group, {}).setdefault(entry.version, entry)
    groups = []
    for name, versions in by_group.items():
        ordered = sorted(versions.values(), key=_version_key)
        groups.append((max(e.group_priority for e in ordered), name, ordered))
    groups.sort(key=lambda g: (-g[0], g[1]))
    return [(name, ordered) for _, name, ordered in groups]


def _version_key(entry: VersionEntry) -> tuple[int, object]:
    return (-entry.version_priority, version_sort_key(entry.version))


def group_item(name: str, ordered: Sequence[VersionEntry], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """One APIGroupDiscovery item."""
    return {"metadata": metadata, "versions": [e.to_json() for e in ordered]}


def merge_items(
    entries: Iterable[VersionEntry], metadata: Callable[[str], dict[str, Any]] = group_metadata
) -> list[dict[str, Any]]:
    """APIGroupDiscovery items in document order."""
    return [group_item(name, ordered, metadata(name)) for name, ordered in order_groups(entries)]


def render(items: list[dict[str, Any]]) -> dict[str, Rendered]:
    """The document per served version (`v2`, `v2beta1`), all sharing upstream's ETag."""
    return _render_joined(b",".join(go_marshal(item) for item in items))


def _render_joined(joined: bytes) -> dict[str, Rendered]:
    """`joined` is the items' compact JSON, comma-separated: the document is assembled around it
    byte for byte as encoding the whole document would write it (Go's encoder and ours write
    nested objects identically), and upstream's ETag is the hash of `{"metadata":{},"items":[...]}`.
    The items are not kept as dicts: the rare indented or YAML form parses the bytes."""
    etag = quoted_sha512(b'{"metadata":{},"items":[' + joined + b"]}")
    rendered: dict[str, Rendered] = {}
    for version in ("v2", "v2beta1"):
        head = go_marshal(
            {"kind": DISCOVERY_KIND, "apiVersion": f"{DISCOVERY_GROUP}/{version}", "metadata": {}}
        )
        body = head[:-1] + b',"items":[' + joined + b"]}\n"
        rendered[version] = ParsedLater(body, etag)
    return rendered


class AggregatedDiscovery:
    """Keeps the rendered document in step with its sources; `/apis` serves it without waiting on anything."""

    def __init__(
        self,
        entries: Callable[[], Iterable[VersionEntry]],
        on_render: Callable[[], None] | None = None,
        *,
        metadata: Callable[[str], dict[str, Any]] = group_metadata,
        interval: float = RENDER_INTERVAL,
    ) -> None:
        self._entries = entries
        self._on_render = on_render
        self._metadata = metadata
        self._rendered: dict[str, Rendered] | None = None
        # Each group's item as last rendered (its entries, metadata and JSON): a render re-encodes
        # only the groups whose entries changed, and joins the rest as they were.
        self._fragments: dict[str, tuple[list[VersionEntry], Mapping[str, Any], bytes]] = {}
        # The last document: a change that leaves the bytes equal keeps it (and its ETag).
        self._joined: bytes | None = None
        self._last: dict[str, Rendered] | None = None
        self._render = Throttled(self._scheduled_render, interval=interval, name="aggregated-discovery")

    def invalidate(self) -> None:
        """A source changed: re-render once per burst of changes, or at the next read if sooner."""
        self._rendered = None
        self._render.request()

    def _scheduled_render(self) -> None:
        if self._rendered is None:
            self.document()

    def document_if_rendered(self, version: str = "v2") -> Rendered | None:
        """The document, or None while a throttled render is due: a reader that polls for changes
        (`workers/publisher.py`) renders nothing of its own, so a burst costs one render per interval."""
        if self._rendered is None and self._render.pending:
            return None
        return self.document(version)

    def document(self, version: str = "v2") -> Rendered:
        if self._rendered is None:
            parts: list[bytes] = []
            fragments: dict[str, tuple[list[VersionEntry], Mapping[str, Any], bytes]] = {}
            for name, ordered in order_groups(self._entries()):
                metadata = self._metadata(name)
                cached = self._fragments.get(name)
                if cached is not None and cached[0] == ordered and cached[1] == metadata:
                    fragment = cached
                else:
                    fragment = (ordered, metadata, go_marshal(group_item(name, ordered, metadata)))
                fragments[name] = fragment
                parts.append(fragment[2])
            self._fragments = fragments
            joined = b",".join(parts)
            if self._last is not None and joined == self._joined:
                self._rendered = self._last
            else:
                self._rendered = self._last = _render_joined(joined)
                self._joined = joined
                if self._on_render is not None:
                    self._on_render()
        return self._rendered[version]

    def serve(self, ctx: RequestContext, media: MediaType) -> Response:
        version = media.aggregated_version or "v2"
        content_type = f"{media.media_type};g={DISCOVERY_GROUP};v={version};as={DISCOVERY_KIND}"
        return respond(ctx, self.document(version), media, content_type=content_type, headers=HEADERS)
