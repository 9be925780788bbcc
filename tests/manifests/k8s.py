"""Offline checks of Kubernetes manifests, for the tests of `manifests/`.

There is no cluster here, so each check borrows a real source of truth instead:
- schemas: the official `kubernetes` client's models, generated from upstream's OpenAPI
  (release-1.37). `from_dict` checks types and required fields; `unknown_fields` walks the
  document against each model's field map, as kube-apiserver's strict field validation does.
  The Prometheus Operator's custom resources (the opt-in monitoring overlay) have no model there:
  `CUSTOM_RESOURCES` transcribes the part of their CRD schemas the manifests can use.
- which resources exist and whether they are namespaced: the REST paths in the same client's
  API classes (`/apis/<g>/<v>/namespaces/{namespace}/<plural>` means namespaced).
- kubectl itself: `kubectl kustomize` builds, and `kubectl apply --dry-run=client` runs against
  `DiscoveryServer`, a loopback HTTP server that serves discovery built from those REST paths and
  answers 404 for every object (so kubectl takes the create path it takes on a fresh cluster).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
KUBECTL = shutil.which("kubectl")

Obj = dict[str, Any]


# --- loading ---------------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    """Every YAML file under manifests/ except kustomize's own."""
    return sorted(
        p
        for p in MANIFESTS.rglob("*.y*ml")
        if p.suffix in (".yaml", ".yml") and p.name not in ("kustomization.yaml", "kustomization.yml")
    )


def kustomization_dirs() -> list[Path]:
    """Every directory kustomize can build (Components are only built through an overlay)."""
    dirs = []
    for path in sorted(MANIFESTS.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind", "Kustomization") == "Kustomization":
            dirs.append(path.parent)
    return dirs


def load_documents(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def kustomize(directory: Path) -> list[Obj]:
    """`kubectl kustomize DIR`, parsed."""
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return load_documents(result.stdout)


def find(objs: list[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    for obj in objs:
        meta = obj.get("metadata", {})
        if obj.get("kind") == kind and meta.get("name") == name and meta.get("namespace") == namespace:
            return obj
    raise AssertionError(f"no {kind} {namespace + '/' if namespace else ''}{name} in {describe(objs)}")


def describe(objs: list[Obj]) -> list[str]:
    return [f"{o.get('kind')}/{o.get('metadata', {}).get('name')}" for o in objs]


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


# --- the REST resources Kubernetes serves (from the official client) ---------------------------------


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool


_PATH = re.compile(r"resource_path='(/apis?/[^']*)'")


@functools.cache
def served_resources() -> dict[tuple[str, str, str], Resource]:
    """(group, version, plural) -> Resource, for every resource path in kubernetes.client.api."""
    api_dir = Path(importlib.import_module("kubernetes.client.api").__file__ or "").parent
    cluster: set[tuple[str, str, str]] = set()
    namespaced: set[tuple[str, str, str]] = set()
    for source in api_dir.glob("*_api.py"):
        for path in _PATH.findall(source.read_text()):
            parts = path.strip("/").split("/")
            if parts[0] == "api":
                group, rest = "", parts[1:]
            elif len(parts) > 1:
                group, rest = parts[1], parts[2:]
            else:
                continue
            if not rest:
                continue
            version, rest = rest[0], rest[1:]
            if rest[:2] == ["namespaces", "{namespace}"] and len(rest) >= 3:
                namespaced.add((group, version, rest[2]))
            elif rest and not rest[0].startswith("{") and rest[0] != "watch":
                cluster.add((group, version, rest[0]))
    out = {key: Resource(*key, namespaced=False) for key in cluster}
    out.update({key: Resource(*key, namespaced=True) for key in namespaced})
    return out


def plural_of(kind: str) -> str:
    """The resource name Kubernetes registers for a kind (lower case, regular English plural)."""
    lowered = kind.lower()
    if lowered.endswith("y") and lowered[-2:-1] not in "aeiou":
        return lowered[:-1] + "ies"
    if lowered.endswith(("s", "x", "ch", "sh")):
        return lowered + "es"
    return lowered + "s"


def resource_for(obj: Obj) -> Resource:
    group, version = split_api_version(str(obj.get("apiVersion", "")))
    custom = CUSTOM_RESOURCES.get((group, version, str(obj.get("kind", ""))))
    if custom is not None:
        return custom[0]
    key = (group, version, plural_of(str(obj.get("kind", ""))))
    resource = served_resources().get(key)
    assert resource is not None, (
        f"{obj.get('apiVersion')} {obj.get('kind')}: Kubernetes 1.37 serves no resource {key[2]!r} in "
        f"{obj.get('apiVersion')}"
    )
    return resource


# --- schemas (from the official client's models) --------------------------------------------------


def _models() -> Any:
    return importlib.import_module("kubernetes.client.models")


def model_name(obj: Obj) -> str:
    """`apps/v1` `Deployment` -> `V1Deployment`, the client's model class for it."""
    _, version = split_api_version(str(obj.get("apiVersion", "")))
    return f"V{version[1:]}{obj.get('kind')}"


_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


def unknown_fields(value: Any, type_name: str, where: str = "") -> list[str]:
    """Field paths in `value` that the model `type_name` (recursively) does not define."""
    if match := _LIST.match(type_name):
        if not isinstance(value, list):
            return []  # a type error: from_dict reports it
        return [e for i, item in enumerate(value) for e in unknown_fields(item, match[1], f"{where}[{i}]")]
    if match := _DICT.match(type_name):
        if not isinstance(value, dict):
            return []
        return [e for k, item in value.items() for e in unknown_fields(item, match[1], f"{where}.{k}")]
    model = getattr(_models(), type_name, None)
    if model is None or not isinstance(value, dict):
        return []  # a primitive (str, int, bool, datetime, object): from_dict checks its type
    by_json_name = {json_name: attr for attr, json_name in model.attribute_map.items()}
    errors = []
    for key, item in value.items():
        attr = by_json_name.get(key)
        if attr is None:
            errors.append(f"{where}.{key}".lstrip("."))
            continue
        errors.extend(unknown_fields(item, model.openapi_types[attr], f"{where}.{key}"))
    return errors


def schema_errors(obj: Obj) -> list[str]:
    """Why kube-apiserver would reject `obj`'s shape (unknown fields, wrong types, missing fields)."""
    group, version = split_api_version(str(obj.get("apiVersion", "")))
    custom = CUSTOM_RESOURCES.get((group, version, str(obj.get("kind", ""))))
    if custom is not None:
        return custom_schema_errors(obj, custom[1])
    name = model_name(obj)
    model = getattr(_models(), name, None)
    if model is None:
        return [f"{obj.get('apiVersion')} {obj.get('kind')}: no model {name} in the kubernetes client"]
    errors = [f"unknown field {path!r}" for path in unknown_fields(obj, name)]
    try:
        model.from_dict(obj)
    except Exception as err:  # pydantic.ValidationError, ValueError: the message names the field
        errors.append(str(err))
    return errors


# --- custom resources: the Prometheus Operator's (from their CRDs) -------------------------------
#
# Transcribed from the openAPIV3Schema of prometheus-operator's
# example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml
# (v0.84): the fields these manifests can reasonably use, their types, enums, duration pattern and
# required fields. A field outside this subset is reported as unknown, as strict field validation
# would for a field outside the full schema; extend the subset when a manifest needs more.
#
# A schema is a type name ("string", "boolean", "integer", "int-or-string", "duration"), an enum
# ("enum", values), ("list", item), ("map", value) for additionalProperties, or an object
# {"fields": {...}, "required": (...)}.

Schema = Any
_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def _object(fields: dict[str, Schema], *required: str) -> Schema:
    return {"fields": fields, "required": required}


_KEY_REF = _object({"key": "string", "name": "string", "optional": "boolean"}, "key")
_SELECTOR = _object(
    {
        "matchLabels": ("map", "string"),
        "matchExpressions": (
            "list",
            _object({"key": "string", "operator": "string", "values": ("list", "string")}, "key", "operator"),
        ),
    }
)
_RELABEL = _object(
    {
        "action": "string",
        "modulus": "integer",
        "regex": "string",
        "replacement": "string",
        "separator": "string",
        "sourceLabels": ("list", "string"),
        "targetLabel": "string",
    }
)
_TLS = _object(
    {
        "ca": _object({"configMap": _KEY_REF, "secret": _KEY_REF}),
        "caFile": "string",
        "cert": _object({"configMap": _KEY_REF, "secret": _KEY_REF}),
        "certFile": "string",
        "keyFile": "string",
        "keySecret": _KEY_REF,
        "insecureSkipVerify": "boolean",
        "serverName": "string",
        "minVersion": ("enum", ("TLS10", "TLS11", "TLS12", "TLS13")),
        "maxVersion": ("enum", ("TLS10", "TLS11", "TLS12", "TLS13")),
    }
)
_ENDPOINT = _object(
    {
        "port": "string",
        "targetPort": "int-or-string",
        "path": "string",
        "scheme": ("enum", ("http", "https")),
        "interval": "duration",
        "scrapeTimeout": "duration",
        "honorLabels": "boolean",
        "honorTimestamps": "boolean",
        "followRedirects": "boolean",
        "enableHttp2": "boolean",
        "bearerTokenFile": "string",
        "authorization": _object({"type": "string", "credentials": _KEY_REF}),
        "tlsConfig": _TLS,
        "params": ("map", ("list", "string")),
        "relabelings": ("list", _RELABEL),
        "metricRelabelings": ("list", _RELABEL),
    }
)
_SERVICE_MONITOR_SPEC = _object(
    {
        "selector": _SELECTOR,
        "namespaceSelector": _object({"any": "boolean", "matchNames": ("list", "string")}),
        "endpoints": ("list", _ENDPOINT),
        "jobLabel": "string",
        "targetLabels": ("list", "string"),
        "podTargetLabels": ("list", "string"),
        "sampleLimit": "integer",
        "targetLimit": "integer",
    },
    "endpoints",
    "selector",
)
_RULE = _object(
    {
        "alert": "string",
        "record": "string",
        "expr": "int-or-string",
        "for": "duration",
        "keep_firing_for": "duration",
        "labels": ("map", "string"),
        "annotations": ("map", "string"),
    },
    "expr",
)
_PROMETHEUS_RULE_SPEC = _object(
    {
        "groups": (
            "list",
            _object(
                {
                    "name": "string",
                    "interval": "duration",
                    "limit": "integer",
                    "labels": ("map", "string"),
                    "query_offset": "duration",
                    "partial_response_strategy": "string",
                    "rules": ("list", _RULE),
                },
                "name",
            ),
        )
    }
)

# (group, version, kind) -> (its REST resource, the schema of its spec)
CUSTOM_RESOURCES: dict[tuple[str, str, str], tuple[Resource, Schema]] = {
    ("monitoring.coreos.com", "v1", "ServiceMonitor"): (
        Resource("monitoring.coreos.com", "v1", "servicemonitors", namespaced=True),
        _SERVICE_MONITOR_SPEC,
    ),
    ("monitoring.coreos.com", "v1", "PrometheusRule"): (
        Resource("monitoring.coreos.com", "v1", "prometheusrules", namespaced=True),
        _PROMETHEUS_RULE_SPEC,
    ),
}


def _check(value: Any, schema: Schema, where: str) -> list[str]:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        errors = [f"{where}.{key}: required" for key in schema["required"] if key not in value]
        for key, item in value.items():
            if key not in schema["fields"]:
                errors.append(f"unknown field {f'{where}.{key}'.lstrip('.')!r}")
            else:
                errors.extend(_check(item, schema["fields"][key], f"{where}.{key}"))
        return errors
    if isinstance(schema, tuple):
        kind, inner = schema
        if kind == "enum":
            return [] if value in inner else [f"{where}: {value!r} is not one of {list(inner)}"]
        if kind == "list":
            if not isinstance(value, list):
                return [f"{where}: expected a list"]
            return [e for i, item in enumerate(value) for e in _check(item, inner, f"{where}[{i}]")]
        if not isinstance(value, dict):  # map
            return [f"{where}: expected a map"]
        return [e for k, item in value.items() for e in _check(item, inner, f"{where}.{k}")]
    expected = {
        "string": (str,),
        "boolean": (bool,),
        "integer": (int,),
        "int-or-string": (int, str),
        "duration": (str,),
    }[schema]
    if not isinstance(value, expected) or (schema == "integer" and isinstance(value, bool)):
        return [f"{where}: expected {schema}, got {value!r}"]
    if schema == "duration" and not (isinstance(value, str) and _DURATION.match(value)):
        return [f"{where}: {value!r} is not a duration"]
    return []


def custom_schema_errors(obj: Obj, spec: Schema) -> list[str]:
    """`schema_errors` for a custom resource: metadata against the ObjectMeta model, spec against
    the transcribed CRD schema."""
    errors = [
        f"unknown field {key!r}" for key in obj if key not in ("apiVersion", "kind", "metadata", "spec")
    ]
    if "spec" in obj:
        errors.extend(_check(obj["spec"], spec, "spec"))
    else:
        errors.append("spec: required")
    metadata = obj.get("metadata", {})
    errors.extend(f"unknown field {path!r}" for path in unknown_fields(metadata, "V1ObjectMeta", "metadata"))
    try:
        _models().V1ObjectMeta.from_dict(metadata)
    except Exception as err:  # pydantic.ValidationError, ValueError: the message names the field
        errors.append(str(err))
    return errors


# --- kubectl against a discovery-only server --------------------------------------------------------


class DiscoveryServer:
    """Serves `/api`, `/apis` and resource lists for `resources`; every other GET is a 404 Status.

    Enough for `kubectl apply --dry-run=client --validate=false`: kubectl maps each kind to its
    resource (unknown kind or version = error), decides namespaced or not, GETs the object (404, so
    it would create it) and prints the result without sending anything.
    """

    def __init__(self, resources: list[tuple[Resource, str]]) -> None:
        self.requests: list[str] = []
        self._bodies = self._render(resources)
        handler = self._handler()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @staticmethod
    def _render(resources: list[tuple[Resource, str]]) -> dict[str, Obj]:
        by_gv: dict[tuple[str, str], list[Obj]] = {}
        for resource, kind in resources:
            by_gv.setdefault((resource.group, resource.version), []).append(
                {
                    "name": resource.plural,
                    "singularName": kind.lower(),
                    "namespaced": resource.namespaced,
                    "kind": kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
            )
        by_gv.setdefault(("", "v1"), [])
        bodies: dict[str, Obj] = {
            "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
            "/apis": {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                        "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
                    }
                    for group, version in sorted(by_gv)
                    if group
                ],
            },
        }
        for (group, version), items in by_gv.items():
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            bodies[path] = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": items,
            }
        return bodies

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                server.requests.append(f"GET {path}")
                body = server._bodies.get(path)
                code = 200
                if body is None:
                    code = 404
                    body = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "NotFound",
                        "message": f"{path} not found",
                        "code": 404,
                    }
                self._send(code, body)

            def _refuse(self) -> None:
                # A client dry run must never write: fail loudly if kubectl tries.
                server.requests.append(f"{self.command} {self.path}")
                self._send(405, {"kind": "Status", "apiVersion": "v1", "code": 405})

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

            def _send(self, code: int, body: Obj) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "offline", "cluster": {"server": self.url}}],
                    "users": [{"name": "offline", "user": {"token": "unused"}}],
                    "contexts": [
                        {
                            "name": "offline",
                            "context": {"cluster": "offline", "user": "offline", "namespace": "default"},
                        }
                    ],
                    "current-context": "offline",
                }
            )
        )
        return path

    @contextlib.contextmanager
    def running(self) -> Iterator[DiscoveryServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def kubectl_apply_dry_run(kubeconfig: Path, *source: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --dry-run=client --validate=false` (schemas are checked by `schema_errors`).

    Its discovery cache sits beside the kubeconfig, not in the user's ~/.kube/cache, which `make
    test`'s workers would otherwise all write at once."""
    assert KUBECTL is not None
    cache = ["--cache-dir", str(kubeconfig.parent / "cache")]
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *cache, "apply", "--dry-run=client", "--validate=false", *source],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
