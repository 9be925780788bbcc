"""The labels of kube-apiserver's request metrics, derived exactly as upstream derives them.

Dashboards and SLO rules select on `verb="LIST"`, `scope="namespace"`, `dry_run=""`, so these
must be upstream's values, quirks included. Ported from k8s.io/apiserver
`pkg/endpoints/metrics/metrics.go` (`CanonicalVerb`, `CleanVerb`, `cleanVerb`, `getVerbIfWatch`,
`CleanScope`, `cleanDryRun`) and, for what a go-restful route contributes to `MonitorRequest`
(its action verb and its scope), `pkg/endpoints/installer.go` `registerResourceHandlers`.
"""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.web.requestinfo import RequestInfo

OTHER = "other"
WATCH = "WATCH"
WATCHLIST = "WATCHLIST"
# metrics.go `validRequestMethods`: anything else is reported as `other`.
VALID_VERBS = frozenset(
    {
        "APPLY",
        "CONNECT",
        "CREATE",
        "DELETE",
        "DELETECOLLECTION",
        "GET",
        "LIST",
        "PATCH",
        "POST",
        "PROXY",
        "PUT",
        "UPDATE",
        WATCH,
        WATCHLIST,
    }
)
# metrics.go `validConnectRequests`: these subresources are reported as CONNECT.
CONNECT_SUBRESOURCES = frozenset({"log", "exec", "portforward", "attach", "proxy"})
# The subresources kube-apiserver serves with a `rest.Connecter` (installer.go's CONNECT action);
# `log` is a getter, so its route's action verb is GET.
_CONNECTER_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy"})
APPLY_PATCH_CONTENT_TYPE = "application/apply-patch+yaml"  # types.ApplyPatchType
# maxinflight.go `nonMutatingRequestVerbs`, and the `request_kind` values of metrics.go.
_READ_ONLY_VERBS = frozenset({"get", "list", "watch"})
READ_ONLY_KIND = "readOnly"
MUTATING_KIND = "mutating"


def canonical_verb(verb: str, scope: str) -> str:
    """`CanonicalVerb`: GET (or HEAD) of anything but one object is a LIST. `verb` is upper case."""
    if verb in ("GET", "HEAD"):
        return "LIST" if scope not in ("resource", "") else "GET"
    return verb


def watch_requested(method: str, query: Mapping[str, list[str]]) -> bool:
    """`getVerbIfWatch`: a GET whose first `watch` value is not `0`/`false` (any case) is a watch."""
    if method.upper() not in ("GET", "LIST"):
        return False
    values = query.get("watch")
    if not values:
        return False
    return values[0].lower() not in ("0", "false")


def clean_verb(verb: str, watch: bool, content_type: str, info: RequestInfo | None) -> str:
    """`CleanVerb`: tell WATCH from LIST, APPLY from PATCH and CONNECT from the rest.

    Only an exact `application/apply-patch+yaml` Content-Type is an APPLY (upstream compares the
    header to the constant).
    """
    reported = verb
    if watch:
        reported = WATCH
    if verb == WATCHLIST:
        reported = WATCH
    if verb == "PATCH" and content_type == APPLY_PATCH_CONTENT_TYPE:
        reported = "APPLY"
    if info is not None and info.is_resource_request and info.subresource in CONNECT_SUBRESOURCES:
        reported = "CONNECT"
    return reported


def report_verb(verb: str, suggested: str, watch: bool, content_type: str, info: RequestInfo | None) -> str:
    """`cleanVerb`: the route's WATCH/WATCHLIST wins (the `/watch/` path form), unknown verbs are
    `other`. `watch` is `watch_requested` of the request."""
    if suggested in (WATCH, WATCHLIST):
        return WATCH
    reported = clean_verb(verb, watch, content_type, info)
    return reported if reported in VALID_VERBS else OTHER


def clean_scope(info: RequestInfo) -> str:
    """`CleanScope`: what terminations, drops and long-running requests are labelled with."""
    if info.name or info.verb == "create":
        return "resource"
    if info.namespace:
        return "namespace"
    if info.is_resource_request:
        return "cluster"
    return ""


def route_scope(info: RequestInfo) -> str:
    """The scope of the go-restful route kube-apiserver serves a resource request with.

    installer.go: a path with `{name}` or a POST is `resource`, a namespaced collection is
    `namespace`, anything else (cluster-scoped, or across all namespaces) is `cluster`. Unlike
    `clean_scope`, a name taken from `fieldSelector=metadata.name=...` does not make a list a
    `resource` request: the route is still the collection's, and its verb stays LIST.
    """
    if info.verb == "create" or len(info.parts) >= 2:
        return "resource"
    return "namespace" if info.namespace else "cluster"


def _watch_in_path(info: RequestInfo) -> bool:
    """Whether `watch` came from the deprecated `/api/v1/watch/...` form rather than `?watch=`."""
    segments = info.path.strip("/").split("/")
    index = 2 if info.api_prefix == "api" else 3  # /api/<v>/watch, /apis/<g>/<v>/watch
    return len(segments) > index and segments[index] == "watch"


def action_verb(info: RequestInfo, method: str) -> str:
    """The verb of the installer.go action (route) that serves a resource request.

    `MonitorRequest` gets it as `verb`: the path form of watch reports WATCH through it, and only
    GET and LIST actions record `apiserver_response_sizes` (so a `?watch=1` list does, under verb
    WATCH, and `/watch/...` does not).
    """
    has_name = len(info.parts) >= 2
    if info.verb == "watch" and _watch_in_path(info):
        return WATCH if has_name else WATCHLIST
    if info.verb == "proxy":
        return "PROXY"
    if info.subresource in _CONNECTER_SUBRESOURCES:
        return "CONNECT"
    upper = method.upper()
    if upper in ("GET", "HEAD"):
        return "GET" if has_name else "LIST"
    if upper == "DELETE":
        return "DELETE" if has_name else "DELETECOLLECTION"
    return upper


def clean_dry_run(query: Mapping[str, list[str]]) -> str:
    """`cleanDryRun`: the sorted, distinct `dryRun` values joined by `,`; `invalid` if any is not `All`."""
    values = query.get("dryRun")
    if not values:
        return ""
    if any(value != "All" for value in values):  # validation.ValidateDryRun
        return "invalid"
    return ",".join(sorted(set(values)))


def request_kind(info: RequestInfo) -> str:
    """`readOnly` for get/list/watch, `mutating` for everything else (maxinflight.go)."""
    return READ_ONLY_KIND if info.verb in _READ_ONLY_VERBS else MUTATING_KIND
