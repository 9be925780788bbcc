"""Request attributes exactly as kube-apiserver's `RequestInfoFactory` derives them.

The authorizer asks "may user U <verb> <resource> in <namespace>?" and RBAC answers for the
attributes it is given, so they must be the ones the backend will act on: `GET .../pods` is a
`list`, `?watch=1` makes it a `watch`, `DELETE` without a name is a `deletecollection`, a list or
watch whose field selector pins `metadata.name` is a request for that one name, and everything
outside `/api/<v>/...` and `/apis/<g>/<v>/...` is a non-resource path with the lower-cased HTTP
method as verb. Ported from apiserver `pkg/endpoints/request/requestinfo.go` (with the
`AuthorizeWithSelectors` behaviour, on by default since Kubernetes 1.32).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from aggregator.model.selectors import (
    SelectorError,
    exact_match,
    is_int64,
    parse_field_selector,
    parse_label_selector,
)
from aggregator.wire.gourl import EscapeError, path_unescape

log = logging.getLogger(__name__)

API_PREFIXES = frozenset({"api", "apis"})
GROUPLESS_API_PREFIXES = frozenset({"api"})
# Verbs given as a path segment (`/api/v1/watch/pods`); `proxy` takes no subresource.
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_SPECIAL_VERBS_NO_SUBRESOURCES = frozenset({"proxy"})
# `/api/v1/namespaces/<ns>/status` is the namespace's subresource, not a resource named "status".
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_VERBS_WITH_SELECTORS = frozenset({"list", "watch", "deletecollection"})
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


class RequestInfoError(Exception):
    """Upstream's `NewRequestInfo` error: the request is answered with a 500."""


class RequestInfo(NamedTuple):
    """Upstream's `RequestInfo` (a tuple: built for every request, so built cheaply)."""

    is_resource_request: bool
    path: str
    verb: str
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = ()
    # Unparsed selectors, only for list/watch/deletecollection not using the `/watch/` path form.
    field_selector: str = ""
    label_selector: str = ""


_FALSE_FOLDS = ("fF", "aA", "lL", "sS\u017f", "eE")


def _go_false(text: str) -> bool:
    """apimachinery's bool conversion: only `0` and `false` (Go's `strings.EqualFold`, which also
    folds U+017F LONG S into `s`) are false."""
    if text == "0":
        return True
    return len(text) == 5 and all(ch in folds for ch, folds in zip(text, _FALSE_FOLDS, strict=True))


def _list_options(query: Mapping[str, list[str]]) -> tuple[bool, str | None]:
    """(watch, fieldSelector) as `ParameterCodec.DecodeParameters` into ListOptions sees them.

    Any decoding error (a bad selector, a non-integer `limit` or `timeoutSeconds`) resets the
    options: the verb then comes from `watch` alone and no name is taken from the field selector.
    """
    watch_values = query.get("watch") or []
    watch = bool(watch_values) and not _go_false(watch_values[0])
    try:
        for key in ("limit", "timeoutSeconds"):
            values = query.get(key)
            if values and not is_int64(values[0]):
                raise ValueError(f"{key}: {values[0]!r} is not an integer")
        field_values = query.get("fieldSelector")
        label_values = query.get("labelSelector")
        field = field_values[0] if field_values else ""
        fields = parse_field_selector(field)
        parse_label_selector(label_values[0] if label_values else "")
    except (ValueError, SelectorError) as err:
        log.debug("could not decode list options", extra={"fields": {"reason": str(err)}})
        return _fallback_watch(query), None
    return watch, exact_match(fields, "metadata.name")


def _fallback_watch(query: Mapping[str, list[str]]) -> bool:
    values = query.get("watch") or []
    return bool(values) and values[0].lower() not in ("false", "0")


def _valid_path_segment_name(name: str) -> bool:
    """`path.IsValidPathSegmentName`."""
    return name not in (".", "..") and "/" not in name and "%" not in name


def new_request_info(
    method: str,
    path: str,
    query: Mapping[str, list[str]],
    *,
    api_prefixes: frozenset[str] = API_PREFIXES,
    groupless_prefixes: frozenset[str] = GROUPLESS_API_PREFIXES,
    request_uri: str = "",
) -> RequestInfo:
    """`RequestInfoFactory.NewRequestInfo` for a decoded path and parsed query (`gourl.parse_query`).

    Built for every request: index arithmetic on one split instead of slicing, and a positional
    tuple."""
    parts = path.strip("/").split("/")
    count = len(parts)
    if count < 3 or parts[0] not in api_prefixes:
        return RequestInfo(False, path, method.lower())
    prefix = parts[0]
    i = 1  # the index of the first part not consumed yet
    group = ""
    if prefix not in groupless_prefixes:
        if count < 4:
            return RequestInfo(False, path, method.lower())
        group = parts[1]
        i = 2
    version = parts[i]
    i += 1

    verb_via_path = False
    if parts[i] in _SPECIAL_VERBS:
        if count - i < 2:
            raise RequestInfoError(f"unable to determine kind and namespace from url, {request_uri or path}")
        verb = parts[i]
        i += 1
        verb_via_path = True
    else:
        verb = _METHOD_VERBS.get(method, "")

    namespace = ""
    if parts[i] == "namespaces" and count - i > 1:
        namespace = parts[i + 1]
        if count - i > 2 and parts[i + 2] not in _NAMESPACE_SUBRESOURCES:
            i += 2

    left = count - i
    resource = parts[i]
    name = parts[i + 1] if left >= 2 else ""
    subresource = parts[i + 2] if left >= 3 and verb not in _SPECIAL_VERBS_NO_SUBRESOURCES else ""

    if not name and verb == "get":
        watch, selected_name = _list_options(query)
        verb = "watch" if watch else "list"
        if selected_name is not None and _valid_path_segment_name(selected_name):
            name = selected_name
    if not name and verb == "delete":
        verb = "deletecollection"

    field_selector = label_selector = ""
    if query and not verb_via_path and verb in _VERBS_WITH_SELECTORS:
        if values := query.get("fieldSelector"):
            field_selector = values[0]
        if values := query.get("labelSelector"):
            label_selector = values[0]

    return RequestInfo(
        True,
        path,
        verb,
        prefix,
        group,
        version,
        namespace,
        resource,
        subresource,
        name,
        tuple(parts[i:]),
        field_selector,
        label_selector,
    )


def decoded_path(raw_path: str) -> str:
    """The path as Go's `URL.Path` holds it (`%2F` is a `/`); a malformed escape stays as sent
    (a Go server refuses such a request with 400 before authorizing it)."""
    try:
        return path_unescape(raw_path)
    except EscapeError:
        return raw_path
