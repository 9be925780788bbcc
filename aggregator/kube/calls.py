"""Every kube-apiserver call the gateway makes, declared once.

The gateway's RBAC (its ClusterRoles, and a Role for its Lease) must grant exactly these, so they
live in one place: a test enumerates `declared_calls()` and checks each against the deployment's
RBAC, and `KubeClient` refuses any `ApiCall` that is not declared here. To call something new, add
a constant below.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

# RBAC verb -> HTTP method. `list` and `watch` are both GETs on the collection.
_METHODS = {
    "get": "GET",
    "list": "GET",
    "watch": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
}


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One kind of request to kube-apiserver, described the way RBAC describes it.

    A resource call names (group, version, resource[, subresource]); a non-resource call (such as
    kube-apiserver's own `/apis` discovery) sets `path` instead and leaves the resource empty.
    `namespaced` says the resource lives in namespaces: such a call may be made for one namespace
    or, without one, across all of them.
    """

    verb: str
    group: str = ""
    version: str = "v1"
    resource: str = ""
    subresource: str = ""
    namespaced: bool = False
    path: str = ""

    def __post_init__(self) -> None:
        if self.verb not in _METHODS:
            raise ValueError(f"unknown verb {self.verb!r}")
        if bool(self.path) == bool(self.resource):
            raise ValueError("an ApiCall names either a resource or a non-resource path")
        if self.path and self.verb != "get":
            raise ValueError("non-resource calls are GETs")

    @property
    def method(self) -> str:
        return _METHODS[self.verb]

    @property
    def rbac_resource(self) -> str:
        """What a ClusterRole rule lists: `apiservices` or `apiservices/status`."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def url_path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        """The request path (without the server's base URL)."""
        if self.path:
            if self.path.endswith("/*"):
                # A family of non-resource paths (RBAC's trailing `*`): `name` is the rest of the path.
                if not name or name.startswith("/"):
                    raise ValueError(f"{self} needs the rest of the path as its name")
                return self.path[:-1] + name
            return self.path
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace:
            if not self.namespaced:
                raise ValueError(f"{self.resource} is cluster-scoped; no namespace allowed")
            root += f"/namespaces/{namespace}"
        path = f"{root}/{self.resource}"
        if self.verb in ("get", "update", "patch", "delete") or self.subresource:
            if not name:
                raise ValueError(f"{self.verb} {self.rbac_resource} needs an object name")
            path += f"/{name}"
        elif name:
            raise ValueError(f"{self.verb} {self.resource} acts on the collection; no name allowed")
        if self.subresource:
            path += f"/{self.subresource}"
        return path

    def __str__(self) -> str:
        if self.path:
            return f"{self.verb} {self.path}"
        group = self.group or "core"
        return f"{self.verb} {self.rbac_resource}.{group}"


# --- object source (aggregator/sources/kube.py) ----------------------------------------------------
LIST_APISERVICES = ApiCall("list", "apiregistration.k8s.io", "v1", "apiservices")
WATCH_APISERVICES = ApiCall("watch", "apiregistration.k8s.io", "v1", "apiservices")
LIST_SERVICES = ApiCall("list", "", "v1", "services", namespaced=True)
WATCH_SERVICES = ApiCall("watch", "", "v1", "services", namespaced=True)
LIST_ENDPOINTSLICES = ApiCall("list", "discovery.k8s.io", "v1", "endpointslices", namespaced=True)
WATCH_ENDPOINTSLICES = ApiCall("watch", "discovery.k8s.io", "v1", "endpointslices", namespaced=True)

# --- availability (aggregator/availability/) ------------------------------------------------------
# `--write-apiservice-status` only (overlay write-apiservice-status); GET re-reads after a 409 conflict.
UPDATE_APISERVICE_STATUS = ApiCall(
    "update", "apiregistration.k8s.io", "v1", "apiservices", subresource="status"
)
GET_APISERVICES = ApiCall("get", "apiregistration.k8s.io", "v1", "apiservices")

# --- leader election (aggregator/leaderelection.py), with `--write-apiservice-status` ----------------
# One Lease, --leader-elect-resource-namespace/--leader-elect-resource-name (default: the gateway's
# namespace, `aggregator`). No watch: candidates poll every --leader-elect-retry-period.
GET_LEASES = ApiCall("get", "coordination.k8s.io", "v1", "leases", namespaced=True)
CREATE_LEASES = ApiCall("create", "coordination.k8s.io", "v1", "leases", namespaced=True)
UPDATE_LEASES = ApiCall("update", "coordination.k8s.io", "v1", "leases", namespaced=True)

# --- authentication and authorization (aggregator/auth/) -------------------------------------------
CREATE_TOKENREVIEWS = ApiCall("create", "authentication.k8s.io", "v1", "tokenreviews")
CREATE_SUBJECTACCESSREVIEWS = ApiCall("create", "authorization.k8s.io", "v1", "subjectaccessreviews")
# Only kube-system/extension-apiserver-authentication, selected by metadata.name (the authorizer
# sees the name: upstream's extension-apiserver-authentication-reader Role grants list and watch on it).
LIST_CONFIGMAPS = ApiCall("list", "", "v1", "configmaps", namespaced=True)
WATCH_CONFIGMAPS = ApiCall("watch", "", "v1", "configmaps", namespaced=True)

# --- API Priority and Fairness (aggregator/flowcontrol/sources.py): the cluster's configuration, kube mode --
LIST_FLOWSCHEMAS = ApiCall("list", "flowcontrol.apiserver.k8s.io", "v1", "flowschemas")
WATCH_FLOWSCHEMAS = ApiCall("watch", "flowcontrol.apiserver.k8s.io", "v1", "flowschemas")
LIST_PRIORITYLEVELCONFIGURATIONS = ApiCall("list", "flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations")
WATCH_PRIORITYLEVELCONFIGURATIONS = ApiCall(
    "watch", "flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations"
)

# --- aggregated discovery (aggregator/discovery/delegated.py): kube-apiserver's own `/apis`, kube mode --
GET_APIS = ApiCall("get", path="/apis")

# --- OpenAPI aggregation (aggregator/openapi/): kube-apiserver's own documents, in kube mode --------
GET_OPENAPI_V2 = ApiCall("get", path="/openapi/v2")
GET_OPENAPI_V3 = ApiCall("get", path="/openapi/v3")
# One group-version's document: name = "apis/<group>/<version>" or "api/v1".
GET_OPENAPI_V3_GROUP_VERSION = ApiCall("get", path="/openapi/v3/*")


@functools.cache
def declared_calls() -> frozenset[ApiCall]:
    """Every ApiCall constant in this module (computed once, after all are defined)."""
    module = sys.modules[__name__]
    return frozenset(v for v in vars(module).values() if isinstance(v, ApiCall))


def is_declared(call: ApiCall) -> bool:
    return call in declared_calls()
