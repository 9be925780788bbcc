"""apiserver's `RequestInfoFactory` for this server's paths: verb, version, namespace, resource, name."""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.sample.api import GROUP

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


@dataclass(frozen=True)
class RequestInfo:
    resource_request: bool
    verb: str
    path: str
    version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""


def request_info(method: str, path: str, query_watch: str) -> RequestInfo:
    """Parse `/apis/<group>/<version>/[watch/][namespaces/<ns>/]<resource>[/<name>[/<sub>]]`."""
    verb = _VERBS.get(method, method.lower())
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[0] != "apis" or parts[1] != GROUP:
        return RequestInfo(False, method.lower(), path)
    version = parts[2]
    rest = parts[3:]
    watch_prefix = False
    if rest and rest[0] == "watch":
        watch_prefix = True
        rest = rest[1:]
    namespace = ""
    if len(rest) > 1 and rest[0] == "namespaces":
        namespace = rest[1]
        if len(rest) > 2:
            rest = rest[2:]
    if not rest or not rest[0]:
        return RequestInfo(False, method.lower(), path)
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if watch_prefix:
        verb = "watch"
    elif verb == "get" and not name:
        verb = "watch" if query_watch in _TRUE else "list"
    elif verb == "delete" and not name:
        verb = "deletecollection"
    return RequestInfo(True, verb, path, version, namespace, resource, name, subresource)
