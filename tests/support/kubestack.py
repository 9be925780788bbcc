"""A small cluster for real kubectl: the fake kube-apiserver, the sample wardle server, and the
gateway as it ships: `aggregator serve` in kube mode, `--workers N`, no CA flags.

    async with KubeStack(pki, tmp_path, policy=policy, workers=2) as stack:  # the cluster, no gateway yet
        stack.openapi.settle(3)                    # e.g. a kube-apiserver still settling
        await stack.start_gateway()                # ready (`/readyz` 200) when it returns
        code, out, err = await stack.kubectl(binary, user="ops")("explain", "deployments.spec.replicas")

The gateway reads its client CA and front-proxy settings from the fake's
`kube-system/extension-apiserver-authentication` alone, as the manifests run it: callers present
client certificates signed by the cluster's client CA (`stack.user(...)`), the same ones the fake
accepts, and the gateway's front-proxy certificate is signed by the cluster's front-proxy CA.

The fake kube-apiserver serves what kubectl reads of a real one: aggregated discovery for `/api`
and `/apis` (core v1 configmaps, pods, secrets; apps/v1 deployments), OpenAPI v3 and v2 for those
built-ins exactly as kube-openapi serves them (`fakeopenapi.py`, hash redirects included), its
objects, and SubjectAccessReviews. `policy` (a SubjectAccessReview spec -> status) judges both the
gateway's reviews and the fake's own decisions (impersonation, its resources: `fakeauthz.py`).

The sample wardle server is registered in the fake as a remote APIService pair with its Service and
EndpointSlice, trusts the cluster's front-proxy CA for the gateway's front-proxy certificate (the
same certificate the fake accepts from the delegate), and allows the group `wardle-admins`
everything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from sample_apiserver import SampleOptions, SampleServer

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.commands.wardle import local_manifests
from aggregator.tls.issue import issue_serving_cert, load_pair, new_ca, write_pair
from tests.support.e2e import Kubectl
from tests.support.fakeauthz import KubeAuthorization, Policy
from tests.support.fakekube import FakeKube, FakeResource, running_fake_kube
from tests.support.fakeopenapi import KubeOpenAPI
from tests.support.fakereviews import FakeReviews, allow_all
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port
from tests.support.served import Served, serving

JSON = dict[str, Any]
SECRETS = FakeResource("", "v1", "secrets", "Secret", True)
WARDLE_ADMINS = "wardle-admins"
# Who kubectl is by default: the cluster's admin client certificate, as kubeadm writes it.
ADMIN = ("kubernetes-admin", ("system:masters",))
# Loopback is where the sample listens; kube mode denies it by default.
DENY_CIDRS = "169.254.0.0/16,fe80::/10"
ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


# --- kube-apiserver's built-in documents ----------------------------------------------------------------

DEPLOYMENT = "io.k8s.api.apps.v1.Deployment"
DEPLOYMENT_SPEC = "io.k8s.api.apps.v1.DeploymentSpec"
CONFIG_MAP = "io.k8s.api.core.v1.ConfigMap"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
REPLICAS_DOC = (
    "Number of desired pods. This is a pointer to distinguish between explicit zero and not specified. "
    "Defaults to 1."
)


def _schemas(ref: str) -> dict[str, JSON]:
    """The built-in schemas as kube-apiserver publishes them (`ref` is the $ref prefix: v2 or v3)."""

    def field(name: str, description: str) -> JSON:
        return {"allOf": [{"$ref": ref + name}], "default": {}, "description": description}

    string = {"type": "string"}
    return {
        DEPLOYMENT: {
            "description": "Deployment enables declarative updates for Pods and ReplicaSets.",
            "type": "object",
            "properties": {
                "apiVersion": {**string, "description": "APIVersion defines the versioned schema of this representation of an object."},
                "kind": {**string, "description": "Kind is a string value representing the REST resource this object represents."},
                "metadata": field(OBJECT_META, "Standard object's metadata."),
                "spec": field(DEPLOYMENT_SPEC, "Specification of the desired behavior of the Deployment."),
            },
            "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}],
        },
        DEPLOYMENT_SPEC: {
            "description": "DeploymentSpec is the specification of the desired behavior of the Deployment.",
            "type": "object",
            "properties": {
                "paused": {"type": "boolean", "description": "Indicates that the deployment is paused."},
                "replicas": {"type": "integer", "format": "int32", "description": REPLICAS_DOC},
            },
        },
        CONFIG_MAP: {
            "description": "ConfigMap holds configuration data for pods to consume.",
            "type": "object",
            "properties": {
                "data": {"type": "object", "additionalProperties": {**string, "default": ""}, "description": "Data contains the configuration data."},
                "metadata": field(OBJECT_META, "Standard object's metadata."),
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "ConfigMap", "version": "v1"}],
        },
        OBJECT_META: {
            "description": "ObjectMeta is metadata that all persisted resources must have.",
            "type": "object",
            "properties": {"name": {**string, "description": "Name must be unique within a namespace."}},
        },
    }  # fmt: skip


def _operation(kind: str, group: str) -> JSON:
    return {
        "get": {
            "operationId": f"list{kind}",
            "x-kubernetes-action": "list",
            "x-kubernetes-group-version-kind": {"group": group, "kind": kind, "version": "v1"},
        }
    }


def builtin_v3() -> dict[str, JSON]:
    """`/openapi/v3/api/v1` and `/openapi/v3/apis/apps/v1`."""
    schemas = _schemas("#/components/schemas/")

    def document(path: str, kind: str, group: str, names: list[str]) -> JSON:
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": {path: _operation(kind, group)},
            "components": {"schemas": {n: schemas[n] for n in names}},
        }

    return {
        "api/v1": document("/api/v1/namespaces/{namespace}/configmaps", "ConfigMap", "", [CONFIG_MAP, OBJECT_META]),
        "apis/apps/v1": document(
            "/apis/apps/v1/namespaces/{namespace}/deployments", "Deployment", "apps", [DEPLOYMENT, DEPLOYMENT_SPEC, OBJECT_META]
        ),
    }  # fmt: skip


def builtin_v2() -> JSON:
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": {
            "/api/v1/namespaces/{namespace}/configmaps": _operation("ConfigMap", ""),
            "/apis/apps/v1/namespaces/{namespace}/deployments": _operation("Deployment", "apps"),
        },
        "definitions": _schemas("#/definitions/"),
    }


# --- kube-apiserver's aggregated discovery --------------------------------------------------------------


def _resource(name: str, kind: str, short: list[str] | None = None) -> JSON:
    out: JSON = {
        "resource": name,
        "responseKind": {"group": "", "version": "", "kind": kind},
        "scope": "Namespaced",
        "singularResource": kind.lower(),
        "verbs": ALL_VERBS,
    }
    if short:
        out["shortNames"] = short
    return out


def _group(name: str, resources: list[JSON]) -> JSON:
    metadata: JSON = {"name": name, "creationTimestamp": None} if name else {"creationTimestamp": None}
    return {
        "metadata": metadata,
        "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}],
    }


def serve_discovery(fake: FakeKube) -> None:
    """`/api`, `/apis` (aggregated v2 or v2beta1, else legacy) and `/api/v1`, `/apis/apps/v1`."""
    groups = {
        "": [_resource("configmaps", "ConfigMap", ["cm"]), _resource("pods", "Pod", ["po"]), _resource("secrets", "Secret")],
        "apps": [_resource("deployments", "Deployment", ["deploy"])],
    }  # fmt: skip

    def negotiated(accept: str) -> str | None:
        for clause in accept.split(","):
            params = dict(p.strip().partition("=")[::2] for p in clause.split(";")[1:])
            wanted = params.get("g") == "apidiscovery.k8s.io" and params.get("as") == "APIGroupDiscoveryList"
            if wanted and params.get("v") in ("v2", "v2beta1"):
                return params["v"]
        return None

    async def root(request: web.Request) -> web.Response:
        core = request.path == "/api"
        version = negotiated(request.headers.get("Accept", ""))
        if version is None:
            if core:
                return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
            legacy = [{"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]}]
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": legacy})
        items = [_group("", groups[""])] if core else [_group("apps", groups["apps"])]
        body = {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": f"apidiscovery.k8s.io/{version}",
            "metadata": {},
            "items": items,
        }
        media = f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
        return web.Response(
            body=json.dumps(body, separators=(",", ":")).encode(),
            headers={"Content-Type": media, "Vary": "Accept"},
        )

    async def group_version(request: web.Request) -> web.Response:
        group = "" if request.path == "/api/v1" else "apps"
        resources = [
            {"name": r["resource"], "singularName": r["singularResource"], "namespaced": True, "kind": r["responseKind"]["kind"],
             "verbs": r["verbs"], **({"shortNames": r["shortNames"]} if "shortNames" in r else {})}
            for r in groups[group]
        ]  # fmt: skip
        group_version = f"{group}/v1" if group else "v1"
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }
        )

    for path in ("/api", "/apis"):
        fake.add_route("GET", path, root)
    for path in ("/api/v1", "/apis/apps/v1"):
        fake.add_route("GET", path, group_version)


# --- the stack ---------------------------------------------------------------------------------------------


class KubeStack:
    def __init__(
        self,
        pki: PKI,
        workdir: Path,
        *,
        policy: Policy = allow_all,
        workers: int = 1,
        gateway_args: Sequence[str] = (),
    ) -> None:
        self.pki = pki
        self.workdir = workdir
        self.policy = policy
        self.workers = workers
        self.gateway_args = list(gateway_args)
        self.fake: FakeKube | None = None
        self.reviews: FakeReviews | None = None
        self.authorization: KubeAuthorization | None = None
        self.openapi: KubeOpenAPI | None = None
        self.sample: SampleServer | None = None
        self.gateway: Served | None = None
        self._stack = AsyncExitStack()
        self._homes = 0
        self._users: dict[tuple[str, tuple[str, ...]], str] = {}  # -> file stem

    async def __aenter__(self) -> KubeStack:
        try:
            await self.start_cluster()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    @property
    def kube(self) -> FakeKube:
        assert self.fake is not None
        return self.fake

    @property
    def kube_openapi(self) -> KubeOpenAPI:
        assert self.openapi is not None
        return self.openapi

    @property
    def served(self) -> Served:
        assert self.gateway is not None, "start_gateway() first"
        return self.gateway

    async def start_cluster(self) -> FakeKube:
        """The fake kube-apiserver with everything registered (the gateway is not started yet)."""
        fake = self.fake = await self._stack.enter_async_context(running_fake_kube(self.workdir / "kube"))
        fake.register(SECRETS)
        self.reviews = FakeReviews(fake)
        self.reviews.policy = self.policy
        self.authorization = KubeAuthorization(fake, self.policy).install()
        serve_discovery(fake)
        self.openapi = KubeOpenAPI(fake, builtin_v3(), builtin_v2())
        certs = self.workdir / "wardle-certs"
        certs.mkdir(parents=True, exist_ok=True)
        backend_ca = new_ca("wardle-ca")
        write_pair(certs, "serving", issue_serving_cert(backend_ca, ["api.wardle.svc"]))
        sample = self.sample = SampleServer(
            SampleOptions(
                bind_address="127.0.0.1",
                secure_port=0,
                tls_cert_file=str(certs / "serving.crt"),
                tls_private_key_file=str(certs / "serving.key"),
                requestheader_client_ca_file=str(fake.dir / "front-proxy-ca.crt"),
                requestheader_allowed_names=["front-proxy-client"],
                authorization_allow_groups=["system:masters", WARDLE_ADMINS],
            )
        )
        port = await sample.start()
        self._stack.push_async_callback(sample.stop)
        for doc in local_manifests(backend_ca.cert_pem, port):
            resource = {"APIService": "apiservices", "Service": "services", "EndpointSlice": "endpointslices"}
            fake.add_object(resource[doc["kind"]], doc)
        return fake

    def gateway_command(self, port: int) -> list[str]:
        """`aggregator serve` flags as the manifests set them: kube mode, no CA flags (the cluster's
        ConfigMap), the cluster's front-proxy certificate, `--workers N`."""
        fake = self.kube
        assert fake.kubeconfig is not None
        cert, key = fake.issue_front_proxy_cert()
        return [
            "--kubeconfig", str(fake.kubeconfig),
            "--bind-address", "127.0.0.1",
            "--secure-port", str(port),
            "--tls-cert-file", self.pki.path("serving.crt"),
            "--tls-private-key-file", self.pki.path("serving.key"),
            "--proxy-client-cert-file", str(cert),
            "--proxy-client-key-file", str(key),
            "--backend-deny-cidrs", DENY_CIDRS,
            "--workers", str(self.workers),
            *self.gateway_args,
        ]  # fmt: skip

    async def start_gateway(self) -> Served:
        """Start the gateway process; it is ready (`/readyz` 200) when this returns, and with
        `--workers N` every worker listens: the first worker answers `/readyz` while the others
        may still be starting, and a test that counts the workers answering must not race that."""
        port = free_port()
        log_path = self.workdir / f"gateway-{port}.log"
        served = self.gateway = await self._stack.enter_async_context(
            serving(self.gateway_command(port), port, self.pki.path("ca.crt"), log_path)
        )
        if self.workers > 1:
            await until(
                lambda: "workers serving" in served.log(), timeout=30.0, what="every worker listening"
            )
        return served

    # --- using it ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.served.url

    def user(self, name: str, groups: tuple[str, ...] = ()) -> tuple[str, str]:
        """(certificate, key) files of a client certificate the cluster's client CA signed."""
        stem = self._user_stem(name, groups)
        return str(self.kube.dir / f"{stem}.crt"), str(self.kube.dir / f"{stem}.key")

    def _user_stem(self, name: str, groups: tuple[str, ...]) -> str:
        key = (name, groups)
        if key not in self._users:
            stem = self._users[key] = f"user-{len(self._users)}-{name.replace(':', '_')}"
            self.kube.issue_client_cert(name, groups, stem=stem)
        return self._users[key]

    @property
    def admin(self) -> tuple[str, str]:
        return self.user(*ADMIN)

    def kubectl(self, binary: str, user: str = "admin", groups: tuple[str, ...] = ()) -> Kubectl:
        """kubectl as `user` (the cluster's admin certificate for "admin"), with a fresh HOME."""
        stem = self._user_stem(*ADMIN) if user == "admin" else self._user_stem(user, groups)
        self._homes += 1
        config = self.workdir / f"{user}-{self._homes}.kubeconfig"
        ca = Path(self.pki.path("ca.crt")).read_bytes()
        write_kubeconfig(config, kubeconfig(self.url, ca, load_pair(self.kube.dir, stem)))
        return Kubectl(binary, config, self.workdir / f"home-{self._homes}")

    async def get(
        self,
        path: str,
        *,
        cert: tuple[str, str] | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
    ) -> tuple[int, bytes]:
        """GET on a fresh connection as the cluster's admin, or with `cert`, or with a bearer
        `token` (and no client certificate)."""
        if token is not None:
            return await self.served.get(
                path, headers={**(headers or {}), "Authorization": f"Bearer {token}"}
            )
        return await self.served.get(path, cert=cert or self.admin, headers=headers)
