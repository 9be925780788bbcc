"""A fake kube-apiserver over real TLS, for tests that need a cluster without one.

What it does like the real one:
- objects per resource with one global resourceVersion counter; LIST (paged with `limit` and
  `continue`, items without apiVersion/kind), GET, POST (create), PUT (update, `/status` too),
  DELETE, and WATCH from a resourceVersion: events after it are replayed from a bounded history,
  new ones stream as JSON lines, BOOKMARKs when the watcher allowed them;
- the errors of the generic registry (`registry/generic/registry/store.go`), with upstream's
  messages: 404 NotFound, 409 AlreadyExists on create, 409 Conflict for a stale resourceVersion,
  400 for a body whose name or namespace disagrees with the URL; per resource, its strategy's
  `AllowCreateOnUpdate` / `AllowUnconditionalUpdate` (an update without a resourceVersion is 422
  Invalid where that is false) and its decoding and validation;
- coordination.k8s.io/v1 Leases as kube-apiserver serves them: namespaced, create on update, no
  unconditional update, MicroTimes that must carry exactly 6 fractional digits (400 otherwise),
  and `ValidateLeaseSpec` (422);
- a resourceVersion older than the history window gets 410 Expired, as an HTTP 410 or as an
  in-band ERROR event (`gone_mode`);
- callers authenticate with a bearer token (`tokens`) or a client certificate signed by its client
  CA or its front-proxy CA; anything else gets a 401 Status;
- flowcontrol.apiserver.k8s.io/v1 FlowSchemas and PriorityLevelConfigurations, and from the start the
  bootstrap ones kube-apiserver's ensurer creates (`apf_bootstrap=False` for a cluster without);
- `kube-system/extension-apiserver-authentication` exists from the start, written as kube-apiserver's
  `ClientCARegistrationHook` writes it (`cluster_authentication_trust_controller.go`
  `getConfigMapDataFor`): the client CA, the front-proxy CA, and the requestheader settings as
  JSON string arrays (`json.Marshal`: `["X-Remote-User"]`; kube-apiserver 1.32 writes `[]` for
  its UID headers).

Knobs for tests: `drop_watches()`, `expire_history()`, `send_bookmarks()`, `send_watch_error()`,
`slow()`/`release()`, `counts` of requests by (verb, resource), `requests` seen (with the user),
`add_route()` for other endpoints (TokenReview, SubjectAccessReview, discovery), `serve_json()`,
`register()` for more resources, and `write_kubeconfig()`. `enforce(gate)` runs a gate on every
authenticated request before it is served (`fakeauthz.py`: front-proxy identity, impersonation and
authorization as kube-apiserver applies them); without one, every caller may do everything.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import json
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from aggregator.backends.options import DEFAULT_DENY_CIDRS
from aggregator.commands.certs import write_kubeconfig
from aggregator.config import Options, validate
from aggregator.flowcontrol.bootstrap import ensure
from aggregator.flowcontrol.manifests import encode
from aggregator.tls.issue import (
    KeyPair,
    issue_client_cert,
    issue_serving_cert,
    new_ca,
    write_cert,
    write_pair,
)
from tests.support.backend import Listener
from tests.support.options import flag_options, with_flags
from tests.support.pki import PKI

# The authenticated caller of a request, for handlers added with `add_route`: `request[USER]`.
USER = web.RequestKey("user", str)
# Who the request runs as after front-proxy headers and impersonation (set by an `enforce()` gate).
IDENTITY = web.RequestKey("identity", str)

AUTHENTICATION_NAMESPACE = "kube-system"
AUTHENTICATION_CONFIGMAP = "extension-apiserver-authentication"
FRONT_PROXY_CLIENT = "front-proxy-client"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Obj = dict[str, Any]


# A body kube-apiserver cannot decode: the message of its 400, else None.
Decoder = Callable[[Obj], str | None]
# `ValidateX`: (field path, value as Go prints it, problem) per error.
Validator = Callable[[Obj], list[tuple[str, str, str]]]


@dataclass(frozen=True)
class FakeResource:
    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    # The resource's registry strategy (pkg/registry/<group>/<resource>/strategy.go). The defaults
    # keep this fake's historical leniency for the resources that predate these knobs.
    allow_create_on_update: bool = False
    allow_unconditional_update: bool = True
    decode: Decoder | None = None
    validate: Validator | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def qualified(self) -> str:
        """`schema.GroupResource.String()`, as errors name the resource: `leases.coordination.k8s.io`."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def qualified_kind(self) -> str:
        """`schema.GroupKind.String()`: `Lease.coordination.k8s.io`."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


# metav1.MicroTime's layout, RFC3339Micro: Go's `.000000` demands exactly six digits.
_RFC3339_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def _decode_lease(body: Obj) -> str | None:
    """A Lease's MicroTimes must parse as RFC3339Micro (`MicroTime.UnmarshalJSON`)."""
    spec = body.get("spec") or {}
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and _RFC3339_MICRO.fullmatch(value)):
            return (
                f'Lease in version "v1" cannot be handled as a Lease: parsing time {json.dumps(value)} '
                'as "2006-01-02T15:04:05.000000Z07:00": cannot parse'
            )
    return None


def _validate_lease(body: Obj) -> list[tuple[str, str, str]]:
    """coordination `ValidateLeaseSpec` (the parts a leader election can get wrong)."""
    spec = body.get("spec") or {}
    errors = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        errors.append(("spec.leaseDurationSeconds", str(duration), "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        errors.append(("spec.leaseTransitions", str(transitions), "must be greater than or equal to 0"))
    return errors


APISERVICES = FakeResource("apiregistration.k8s.io", "v1", "apiservices", "APIService", False)
SERVICES = FakeResource("", "v1", "services", "Service", True)
ENDPOINTSLICES = FakeResource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True)
CONFIGMAPS = FakeResource("", "v1", "configmaps", "ConfigMap", True)
# pkg/registry/coordination/lease/strategy.go: AllowCreateOnUpdate true, AllowUnconditionalUpdate false.
LEASES = FakeResource(
    "coordination.k8s.io",
    "v1",
    "leases",
    "Lease",
    True,
    allow_create_on_update=True,
    allow_unconditional_update=False,
    decode=_decode_lease,
    validate=_validate_lease,
)
# flowcontrol.apiserver.k8s.io/v1: cluster-scoped; kube-apiserver's ensurer creates the bootstrap ones.
FLOWSCHEMAS = FakeResource("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", False)
PRIORITY_LEVELS = FakeResource(
    "flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", "PriorityLevelConfiguration", False
)
BUILTIN = (APISERVICES, SERVICES, ENDPOINTSLICES, CONFIGMAPS, LEASES, FLOWSCHEMAS, PRIORITY_LEVELS)


@dataclass(frozen=True)
class Seen:
    """One request the fake answered (after authentication)."""

    method: str
    path: str
    query: dict[str, str]
    user: str | None
    verb: str
    resource: str
    identity: str | None = None  # who it ran as, when a gate is enforced
    traceparent: str | None = None  # W3C Trace Context the caller sent (a traced gateway's call)


@dataclass(frozen=True)
class Attributes:
    """What kube-apiserver's RequestInfo says about a request: resource ones name their resource."""

    verb: str
    path: str
    resource: FakeResource | None = None
    subresource: str = ""
    namespace: str = ""
    name: str = ""


# Run before a request is served: its answer (a refusal), or None to serve it.
Gate = Callable[[web.Request, Attributes], web.StreamResponse | None]


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: str
    type: str
    obj: Obj

    @property
    def namespace(self) -> str:
        return str(self.obj.get("metadata", {}).get("namespace", ""))

    @property
    def name(self) -> str:
        return str(self.obj.get("metadata", {}).get("name", ""))


# Messages a watch queue can carry besides events.
_END, _DROP = "end", "drop"


@dataclass(eq=False)
class _Watch:
    resource: str
    namespace: str
    bookmarks: bool
    queue: asyncio.Queue[_Event | str | Obj] = field(default_factory=asyncio.Queue)
    name: str = ""  # `fieldSelector=metadata.name=<name>`: only that object's events

    def wants(self, event: _Event) -> bool:
        return (
            self.resource == event.resource
            and (not self.namespace or self.namespace == event.namespace)
            and (not self.name or self.name == event.name)
        )


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_response(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    return web.json_response(status(code, reason, message, details), status=code)


class FakeKube:
    """An in-process kube-apiserver stand-in. `await start()`, then point a kubeconfig at `url`."""

    def __init__(
        self, workdir: Path, *, history: int = 1000, port: int = 0, first_rv: int = 100, apf_bootstrap: bool = True
    ) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = new_ca("fake-kube-ca")
        self.client_ca = new_ca("fake-kube-client-ca")
        # kube-apiserver's --requestheader-client-ca-file: signs front-proxy client certificates.
        self.front_proxy_ca = new_ca("fake-kube-front-proxy-ca")
        # Not valid for "localhost": tests of `tls-server-name` connect by that name.
        self.serving = issue_serving_cert(self.ca, ["127.0.0.1", "kubernetes.default.svc"])
        write_cert(self.dir / "ca.crt", self.ca.cert)
        write_cert(self.dir / "client-ca.crt", self.client_ca.cert)
        write_cert(self.dir / "front-proxy-ca.crt", self.front_proxy_ca.cert)
        write_pair(self.dir, "serving", self.serving)
        self.port = port
        # token -> user name; mutate freely to rotate or revoke.
        self.tokens: dict[str, str] = {}
        self.resources: dict[str, FakeResource] = {}
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {}
        for res in BUILTIN:
            self.register(res)
        self.rv = first_rv
        self.history: collections.deque[_Event] = collections.deque(maxlen=history)
        # Watches from a resourceVersion below this get 410.
        self.compacted_rv = 0
        # How a too-old watch is refused: "http" (410 status) or "event" (200 + ERROR event).
        self.gone_mode = "http"
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.requests: list[Seen] = []
        self.unauthorized = 0
        self._watches: list[_Watch] = []
        self._routes: dict[tuple[str, str], Handler] = {}
        self._delays: dict[tuple[str | None, str | None], float] = {}
        self._release = asyncio.Event()
        self._snapshots: dict[str, tuple[int, list[Obj]]] = {}
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._gate: Gate | None = None
        # A kubeconfig for the default gateway credentials (set by `running_fake_kube`).
        self.kubeconfig: Path | None = None
        self.publish_authentication()
        if apf_bootstrap:
            self.ensure_flowcontrol()

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.dir / "serving.crt", self.dir / "serving.key")
        ctx.load_verify_locations(cafile=str(self.dir / "client-ca.crt"))
        ctx.load_verify_locations(cafile=str(self.dir / "front-proxy-ca.crt"))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    async def start(self) -> str:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self._listener = Listener("127.0.0.1", self.port)
        site = web.SockSite(self._runner, self._listener, ssl_context=self.server_context())
        await site.start()
        self.port = int(self._listener.getsockname()[1])
        return self.url

    async def stop(self) -> None:
        """Close every watch and stop listening (state is kept: `start()` again = a restart)."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            self._listener.cut()  # a connection still in its TLS handshake at cleanup is not served on
            self._listener = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    # --- credentials -------------------------------------------------------------------------------

    def add_token(self, token: str, user: str) -> None:
        self.tokens[token] = user

    def issue_client_cert(
        self, user: str, groups: tuple[str, ...] = (), *, stem: str | None = None
    ) -> tuple[Path, Path]:
        """A client certificate the fake accepts; returns (cert file, key file)."""
        pair: KeyPair = issue_client_cert(self.client_ca, user, groups)
        cert, key = write_pair(self.dir, stem or f"client-{user.replace(':', '_')}", pair)
        return cert, key

    def issue_front_proxy_cert(
        self, name: str = FRONT_PROXY_CLIENT, *, stem: str | None = None
    ) -> tuple[Path, Path]:
        """A front-proxy client certificate (kube-apiserver's --proxy-client-cert-file kind), signed
        by the front-proxy CA the ConfigMap publishes; returns (cert file, key file)."""
        pair: KeyPair = issue_client_cert(self.front_proxy_ca, name)
        cert, key = write_pair(self.dir, stem or f"front-proxy-{name.replace(':', '_')}", pair)
        return cert, key

    def publish_authentication(
        self, *, client_ca: bytes | None = None, requestheader_ca: bytes | None = None, **lists: list[str]
    ) -> Obj:
        """Write `kube-system/extension-apiserver-authentication` as kube-apiserver does at start:
        its client and front-proxy CAs (unless given), and the requestheader lists
        (`authentication_configmap`'s defaults: what kube-apiserver 1.32 writes with kubeadm's
        flags, key for key); returns the stored object."""
        return self.add_object(
            CONFIGMAPS,
            authentication_configmap(
                self.client_ca.cert_pem if client_ca is None else client_ca,
                self.front_proxy_ca.cert_pem if requestheader_ca is None else requestheader_ca,
                **lists,
            ),
        )

    def ensure_flowcontrol(self) -> None:
        """The FlowSchemas and PriorityLevelConfigurations kube-apiserver's APF ensurer creates in a new
        cluster (mandatory and suggested), each with its own resourceVersion and UID."""
        levels, schemas = ensure((), ())
        for level in levels:
            self.add_object(PRIORITY_LEVELS, encode(level))
        for schema in schemas:
            self.add_object(FLOWSCHEMAS, encode(schema))

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        client_cert: tuple[Path, Path] | None = None,
        tls_server_name: str | None = None,
        server: str | None = None,
        embed: bool = True,
    ) -> Path:
        """A kubeconfig for this fake with the given credentials (none at all if none are given)."""
        cluster: dict[str, Any] = {"server": server or self.url}
        if embed:
            cluster["certificate-authority-data"] = _b64(self.ca_file.read_bytes())
        else:
            cluster["certificate-authority"] = str(self.ca_file)
        if tls_server_name:
            cluster["tls-server-name"] = tls_server_name
        user: dict[str, Any] = {}
        if token:
            user["token"] = token
        if token_file:
            user["tokenFile"] = str(token_file)
        if client_cert:
            if embed:
                user["client-certificate-data"] = _b64(client_cert[0].read_bytes())
                user["client-key-data"] = _b64(client_cert[1].read_bytes())
            else:
                user["client-certificate"] = str(client_cert[0])
                user["client-key"] = str(client_cert[1])
        config: dict[str, object] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "tester", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
            "current-context": "fake",
        }
        write_kubeconfig(path, config)
        return path

    # --- objects -----------------------------------------------------------------------------------

    def register(self, resource: FakeResource) -> None:
        """Serve another resource (list/watch/get/create/update/delete) under its API path."""
        self.resources[resource.resource] = resource
        self.objects.setdefault(resource.resource, {})

    def _resource(self, resource: str | FakeResource) -> FakeResource:
        return resource if isinstance(resource, FakeResource) else self.resources[resource]

    @staticmethod
    def _key(res: FakeResource, obj: Obj) -> tuple[str, str]:
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if res.namespaced else ""
        if res.namespaced and not namespace:
            namespace = meta["namespace"] = "default"
        return namespace, meta["name"]

    def _record(self, res: FakeResource, kind: str, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        event = _Event(self.rv, res.resource, kind, copy.deepcopy(obj))
        if self.history.maxlen is not None and len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(event)
        for watch in self._watches:
            if watch.wants(event):
                watch.queue.put_nowait(event)
        return copy.deepcopy(obj)

    def add_object(self, resource: str | FakeResource, obj: Obj) -> Obj:
        """Create (or replace) an object; returns it with its new resourceVersion."""
        res = self._resource(resource)
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        key = self._key(res, obj)
        kind = "MODIFIED" if key in self.objects[res.resource] else "ADDED"
        obj["metadata"].setdefault("uid", f"uid-{res.resource}-{key[0]}-{key[1]}")
        self.objects[res.resource][key] = obj
        return self._record(res, kind, obj)

    update_object = add_object

    def delete_object(self, resource: str | FakeResource, name: str, namespace: str = "") -> Obj | None:
        res = self._resource(resource)
        key = (namespace or ("default" if res.namespaced else ""), name)
        obj = self.objects[res.resource].pop(key, None)
        if obj is None:
            return None
        return self._record(res, "DELETED", obj)

    def get_object(self, resource: str | FakeResource, name: str, namespace: str = "") -> Obj | None:
        res = self._resource(resource)
        obj = self.objects[res.resource].get((namespace or ("default" if res.namespaced else ""), name))
        return copy.deepcopy(obj) if obj is not None else None

    # --- knobs -------------------------------------------------------------------------------------

    def drop_watches(self, *, abort: bool = True) -> int:
        """End every open watch: abort the TCP connection (default) or end the stream cleanly."""
        watches, self._watches = self._watches, []
        for watch in watches:
            watch.queue.put_nowait(_DROP if abort else _END)
        return len(watches)

    def open_watches(self, resource: str | None = None) -> int:
        return sum(1 for w in self._watches if resource is None or w.resource == resource)

    def expire_history(self) -> int:
        """Compact: every resourceVersion handed out so far becomes too old to watch from."""
        self.rv += 1
        self.compacted_rv = self.rv
        self.history.clear()
        return self.rv

    def send_bookmarks(self) -> int:
        """A BOOKMARK at the current resourceVersion to each watch that allowed them."""
        sent = 0
        for watch in self._watches:
            if watch.bookmarks:
                res = self.resources[watch.resource]
                watch.queue.put_nowait(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": res.kind,
                            "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(self.rv)},
                        },
                    }
                )
                sent += 1
        return sent

    def send_watch_error(self, code: int = 410, reason: str = "Expired", message: str = "") -> int:
        """An in-band ERROR event on every open watch, which then ends."""
        message = message or f"too old resource version: {self.compacted_rv}"
        watches, self._watches = self._watches, []
        for watch in watches:
            watch.queue.put_nowait({"type": "ERROR", "object": status(code, reason, message)})
            watch.queue.put_nowait(_END)
        return len(watches)

    def slow(self, seconds: float, *, verb: str | None = None, resource: str | None = None) -> None:
        """Delay matching requests (None matches any) by `seconds`, or until `release()`."""
        self._release.clear()
        self._delays[(verb, resource)] = seconds

    def release(self) -> None:
        """Stop delaying: clears every `slow()` and lets delayed requests go on now."""
        self._delays.clear()
        self._release.set()

    def count(self, verb: str, resource: str) -> int:
        return self.counts[(verb, resource)]

    def users(self) -> list[str | None]:
        return [seen.user for seen in self.requests]

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Serve `method path` (method "*" = any) with `handler` after authentication.

        The handler finds the caller in `request[USER]`; counted as ("<method>", path).
        """
        self._routes[(method.upper(), path)] = handler

    def enforce(self, gate: Gate | None) -> None:
        """Run `gate` on every authenticated request from now on (None: serve everyone)."""
        self._gate = gate

    def serve_json(self, path: str, doc: Any, *, status_code: int = 200) -> None:
        """GET `path` returns `doc` as JSON (e.g. kube-apiserver's own `/apis` or `/version`)."""

        async def handler(_request: web.Request) -> web.Response:
            return web.json_response(doc, status=status_code)

        self.add_route("GET", path, handler)

    # --- HTTP ----------------------------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip() in self.tokens:
            return self.tokens[token.strip()]
        peercert = request.transport.get_extra_info("peercert") if request.transport else None
        if peercert:
            for rdn in peercert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        return str(value)
        return None

    async def _delay(self, verb: str, resource: str) -> None:
        seconds = max(
            (s for (v, r), s in self._delays.items() if v in (None, verb) and r in (None, resource)),
            default=0.0,
        )
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._release.wait(), seconds)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        user = self._authenticate(request)
        if user is None:
            self.unauthorized += 1
            return status_response(401, "Unauthorized", "Unauthorized")
        request[USER] = user
        query = dict(request.query)
        route = self._routes.get((request.method, request.path)) or self._routes.get(("*", request.path))
        parsed = self._parse(request.path) if route is None else None
        if parsed is not None:
            res, namespace, name, sub = parsed
            verb = _verb(request.method, name, query)
            # RequestInfo: a list or watch selecting `metadata.name` is authorized for that name.
            named = name or (_selected_name(query) if verb in ("list", "watch") else "")
            attributes = Attributes(verb, request.path, res, sub, namespace, named)
        else:
            attributes = Attributes(_non_resource_verb(request.method), request.path)
        refusal = self._gate(request, attributes) if self._gate is not None else None
        identity = request.get(IDENTITY)
        traceparent = request.headers.get("traceparent")
        if route is not None:
            self.counts[(request.method, request.path)] += 1
            self.requests.append(
                Seen(request.method, request.path, query, user, request.method, request.path, identity, traceparent)
            )
            if refusal is not None:
                return refusal
            await self._delay(request.method, request.path)
            return await route(request)
        if parsed is None:
            self.requests.append(Seen(request.method, request.path, query, user, "", "", identity, traceparent))
            if refusal is not None:
                return refusal
            return status_response(404, "NotFound", "the server could not find the requested resource")
        label = f"{res.resource}/{sub}" if sub else res.resource
        self.counts[(verb, label)] += 1
        self.requests.append(Seen(request.method, request.path, query, user, verb, label, identity, traceparent))
        if refusal is not None:
            return refusal
        await self._delay(verb, label)
        if verb == "watch":
            return await self._watch(request, res, namespace, query)
        if verb == "list":
            return self._list(res, namespace, query)
        if verb == "get":
            obj = self.get_object(res, name, namespace)
            return web.json_response(obj) if obj else _not_found(res, name)
        if verb == "delete":
            obj = self.delete_object(res, name, namespace)
            return web.json_response(obj) if obj else _not_found(res, name)
        try:
            body = await request.json()
        except ValueError:
            return status_response(400, "BadRequest", "request body is not JSON")
        if not isinstance(body, dict):
            return status_response(400, "BadRequest", "request body is not an object")
        if res.decode is not None and not sub:
            problem = res.decode(body)
            if problem is not None:
                return status_response(400, "BadRequest", problem)
        meta = body.setdefault("metadata", {})
        if namespace and res.namespaced:
            # rest.EnsureObjectNamespaceMatchesRequestNamespace
            if meta.get("namespace") and meta["namespace"] != namespace:
                return status_response(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace
        if verb == "create":
            body_name = meta.get("name", "")
            if self.get_object(res, body_name, namespace) is not None:
                return status_response(
                    409,
                    "AlreadyExists",
                    f"{res.qualified} {json.dumps(body_name)} already exists",
                    _details(res, body_name),
                )
            return self._create(res, body)
        return self._update(res, namespace, name, sub, body)

    def _create(self, res: FakeResource, body: Obj) -> web.Response:
        """A new object: system fields are the server's (`rest.FillObjectMetaSystemFields`)."""
        invalid = self._invalid(res, body)
        if invalid is not None:
            return invalid
        for key in ("resourceVersion", "uid", "creationTimestamp"):
            body["metadata"].pop(key, None)
        return web.json_response(self.add_object(res, body), status=201)

    @staticmethod
    def _invalid(res: FakeResource, body: Obj) -> web.Response | None:
        """422 Invalid for what the resource's validation refuses (`errors.NewInvalid`)."""
        errors = res.validate(body) if res.validate is not None else []
        if not errors:
            return None
        name = body.get("metadata", {}).get("name", "")
        texts = [f"{path}: Invalid value: {value}: {problem}" for path, value, problem in errors]
        joined = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
        details = {
            "name": name,
            "group": res.group,
            "kind": res.kind,
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {value}: {problem}",
                    "field": path,
                }
                for path, value, problem in errors
            ],
        }
        return status_response(
            422, "Invalid", f"{res.qualified_kind} {json.dumps(name)} is invalid: {joined}", details
        )

    def _parse(self, path: str) -> tuple[FakeResource, str, str, str] | None:
        for res in self.resources.values():
            if not path.startswith(res.prefix + "/"):
                continue
            parts = path[len(res.prefix) + 1 :].split("/")
            namespace = ""
            if res.namespaced and len(parts) >= 3 and parts[0] == "namespaces":
                namespace, parts = parts[1], parts[2:]
            if not parts or parts[0] != res.resource or len(parts) > 3:
                continue
            name = parts[1] if len(parts) > 1 else ""
            sub = parts[2] if len(parts) > 2 else ""
            return res, namespace, name, sub
        return None

    def _list(self, res: FakeResource, namespace: str, query: dict[str, str]) -> web.Response:
        token = query.get("continue")
        if token:
            snapshot = self._snapshots.get(token)
            if snapshot is None or snapshot[0] < self.compacted_rv:
                return status_response(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                )
            rv, items = snapshot
        else:
            rv = self.rv
            selected = _selected_name(query)
            items = [
                _as_item(o)
                for (ns, object_name), o in sorted(self.objects[res.resource].items())
                if (not namespace or ns == namespace) and (not selected or object_name == selected)
            ]
        limit = int(query.get("limit", "0") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            rest = items[limit:]
            items = items[:limit]
            next_token = f"c{len(self._snapshots) + 1}"
            self._snapshots[next_token] = (rv, rest)
            metadata["continue"] = next_token
        return web.json_response(
            {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": metadata, "items": items}
        )

    def _update(self, res: FakeResource, namespace: str, name: str, sub: str, body: Obj) -> web.Response:
        """The generic registry's `Store.Update`, in its order of checks."""
        body_name = body.get("metadata", {}).get("name")
        if body_name and body_name != name:
            return status_response(
                400,
                "BadRequest",
                f"the name of the object ({body_name}) does not match the name on the URL ({name})",
            )
        current = self.get_object(res, name, namespace)
        if current is None:
            if res.allow_create_on_update and not sub:
                body["metadata"]["name"] = name
                return self._create(res, body)
            return _not_found(res, name)
        sent_rv = body.get("metadata", {}).get("resourceVersion")
        if not sent_rv and not res.allow_unconditional_update:
            field_error = "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            return status_response(
                422,
                "Invalid",
                f"{res.qualified} {json.dumps(name)} is invalid: {field_error}",
                {
                    "name": name,
                    "group": res.group,
                    "kind": res.resource,
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": "Invalid value: 0x0: must be specified for an update",
                            "field": "metadata.resourceVersion",
                        }
                    ],
                },
            )
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            return status_response(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {res.qualified} {json.dumps(name)}: the object has been "
                "modified; please apply your changes to the latest version and try again",
                _details(res, name),
            )
        if not sub:
            invalid = self._invalid(res, body)
            if invalid is not None:
                return invalid
        if sub == "status":
            current["status"] = body.get("status", {})
            new = current
        elif sub:
            return status_response(404, "NotFound", f"subresource {sub} not served by the fake")
        else:
            new = body
            new.setdefault("metadata", {})["name"] = name
            if "status" in current and "status" not in new:
                new["status"] = current["status"]
        return web.json_response(self.add_object(res, new))

    async def _watch(
        self, request: web.Request, res: FakeResource, namespace: str, query: dict[str, str]
    ) -> web.StreamResponse:
        rv_text = query.get("resourceVersion", "")
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        timeout = float(query.get("timeoutSeconds", "0") or 0) or 1800.0
        watch = _Watch(res.resource, namespace, bookmarks, name=_selected_name(query))
        replay: list[_Event | Obj | str]
        if rv_text in ("", "0"):
            replay = [
                event
                for o in (o for _, o in sorted(self.objects[res.resource].items()))
                if watch.wants(event := _Event(self.rv, res.resource, "ADDED", copy.deepcopy(o)))
            ]
        else:
            since = int(rv_text)
            if since < self.compacted_rv:
                message = f"too old resource version: {since} ({self.compacted_rv})"
                if self.gone_mode == "http":
                    return status_response(410, "Expired", message)
                replay = [{"type": "ERROR", "object": status(410, "Expired", message)}, _END]
            else:
                replay = [e for e in self.history if e.rv > since and watch.wants(e)]
        # Registered before any await, so nothing recorded after the replay snapshot is missed.
        if not (replay and replay[-1] == _END):
            self._watches.append(watch)
        for item in replay:
            watch.queue.put_nowait(item)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watch.queue.get(), remaining)
                except TimeoutError:
                    break
                if item == _END:
                    break
                if item == _DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                line = {"type": item.type, "object": item.obj} if isinstance(item, _Event) else item
                await response.write(json.dumps(line).encode() + b"\n")
            await response.write_eof()
            return response
        finally:
            with contextlib.suppress(ValueError):
                self._watches.remove(watch)


def _selected_name(query: dict[str, str]) -> str:
    """The name a `fieldSelector=metadata.name=<name>` (or `==`) selects; "" without one. Other
    field selectors are not served by this fake."""
    selector = query.get("fieldSelector", "")
    if not selector:
        return ""
    key, _, value = selector.partition("=")
    if key != "metadata.name" or "," in selector:
        raise ValueError(f"the fake serves only fieldSelector=metadata.name=<name>, not {selector!r}")
    return value.removeprefix("=")


def _verb(method: str, name: str, query: dict[str, str]) -> str:
    if method == "GET":
        if name:
            return "get"
        return "watch" if query.get("watch", "").lower() in ("true", "1") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _non_resource_verb(method: str) -> str:
    """RequestInfo's verb for a non-resource path: the lower-cased HTTP method."""
    return method.lower()


def _as_item(obj: Obj) -> Obj:
    """List items carry no apiVersion/kind, as kube-apiserver sends them."""
    item = copy.deepcopy(obj)
    item.pop("apiVersion", None)
    item.pop("kind", None)
    return item


def _details(res: FakeResource, name: str) -> dict[str, Any]:
    """StatusDetails of NotFound, AlreadyExists and Conflict: kind is the resource, not the Kind."""
    return {"name": name, "group": res.group, "kind": res.resource}


def _not_found(res: FakeResource, name: str) -> web.Response:
    return status_response(
        404, "NotFound", f"{res.qualified} {json.dumps(name)} not found", _details(res, name)
    )


def _go_json_strings(values: list[str] | None) -> str:
    """`jsonSerializeStringSlice`: Go's `json.Marshal` of a []string (compact; nil is `null`)."""
    return json.dumps(values, separators=(",", ":"))


def authentication_configmap(
    client_ca: bytes | None,
    requestheader_ca: bytes | None,
    *,
    allowed_names: list[str] | None = None,
    username_headers: list[str] | None = None,
    uid_headers: list[str] | None = None,
    group_headers: list[str] | None = None,
    extra_prefixes: list[str] | None = None,
) -> Obj:
    """The ConfigMap's data as `getConfigMapDataFor` builds it: `client-ca-file` when there is a
    client CA; the requestheader keys only with a front-proxy CA, every list JSON-encoded. Lists
    left out are kubeadm's flags: allowed name `front-proxy-client`, `X-Remote-User`,
    `X-Remote-Group`, `X-Remote-Extra-`, no UID headers (1.32 writes `[]`)."""
    allowed_names = [FRONT_PROXY_CLIENT] if allowed_names is None else allowed_names
    username_headers = ["X-Remote-User"] if username_headers is None else username_headers
    uid_headers = [] if uid_headers is None else uid_headers
    group_headers = ["X-Remote-Group"] if group_headers is None else group_headers
    extra_prefixes = ["X-Remote-Extra-"] if extra_prefixes is None else extra_prefixes
    data: dict[str, str] = {}
    if client_ca:
        data["client-ca-file"] = client_ca.decode()
    if requestheader_ca:
        data["requestheader-username-headers"] = _go_json_strings(username_headers)
        data["requestheader-uid-headers"] = _go_json_strings(uid_headers)
        data["requestheader-group-headers"] = _go_json_strings(group_headers)
        data["requestheader-extra-headers-prefix"] = _go_json_strings(extra_prefixes)
        data["requestheader-client-ca-file"] = requestheader_ca.decode()
        data["requestheader-allowed-names"] = _go_json_strings(allowed_names)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": AUTHENTICATION_NAMESPACE, "name": AUTHENTICATION_CONFIGMAP},
        "data": data,
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


GATEWAY_TOKEN = "gateway-token"
GATEWAY_USER = "system:serviceaccount:aggregator:gateway"


@contextlib.asynccontextmanager
async def running_fake_kube(workdir: Path, **kwargs: Any) -> AsyncIterator[FakeKube]:
    """A started fake that accepts GATEWAY_TOKEN as GATEWAY_USER; `fake.kubeconfig` uses that token."""
    fake = FakeKube(workdir, **kwargs)
    await fake.start()
    fake.add_token(GATEWAY_TOKEN, GATEWAY_USER)
    fake.kubeconfig = fake.write_kubeconfig(workdir / "gateway.kubeconfig", token=GATEWAY_TOKEN)
    try:
        yield fake
    finally:
        await fake.stop()


# `kube_options` overrides for a gateway that takes its CAs from the cluster's ConfigMap, as shipped.
CLUSTER_CAS: dict[str, Any] = {
    "client_ca_file": None,
    "requestheader_client_ca_file": None,
    "requestheader_allowed_names": [],
    "authentication_skip_lookup": False,
}


def kube_options(pki: PKI, kubeconfig: Path | str, **overrides: Any) -> Options:
    """A kube-mode gateway on a free port (test PKI serving pair and CAs) reading objects via
    `kubeconfig`; `overrides` are flags by name (`tests/support/options.py`)."""
    base = flag_options(
        bind_address="127.0.0.1",
        secure_port=0,
        tls_cert_file=pki.path("serving.crt"),
        tls_private_key_file=pki.path("serving.key"),
        client_ca_file=pki.path("client-ca.crt"),
        requestheader_client_ca_file=pki.path("front-proxy-ca.crt"),
        requestheader_allowed_names=["front-proxy-client"],
        # Required in kube mode: the gateway's identity towards kube-apiserver as the front proxy.
        proxy_client_cert_file=pki.path("front-proxy-client.crt"),
        proxy_client_key_file=pki.path("front-proxy-client.key"),
        kubeconfig=str(kubeconfig),
        # The fake serves no extension-apiserver-authentication ConfigMap unless a test adds one.
        authentication_skip_lookup=True,
        # The fake cluster's backends listen on loopback, which kube mode denies by default.
        backend_deny_cidrs=list(DEFAULT_DENY_CIDRS),
    )
    options = with_flags(base, **overrides)
    validate(options)
    assert options.source.kube_mode
    return options


# --- sample objects ------------------------------------------------------------------------------


def apiservice(
    group: str = "wardle.example.com",
    version: str = "v1alpha1",
    *,
    service: tuple[str, str] | None = ("wardle", "api"),
    version_priority: int = 15,
    group_priority_minimum: int = 1000,
) -> Obj:
    spec: Obj = {
        "group": group,
        "version": version,
        "groupPriorityMinimum": group_priority_minimum,
        "versionPriority": version_priority,
        "insecureSkipTLSVerify": True,
    }
    if service is not None:
        spec["service"] = {"namespace": service[0], "name": service[1], "port": 443}
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"},
        "spec": spec,
    }


def service(
    namespace: str = "wardle", name: str = "api", *, cluster_ip: str = "10.0.0.10", port: int = 443
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip,
            "ports": [{"name": "https", "port": port, "targetPort": 8443, "protocol": "TCP"}],
        },
    }


def endpointslice(
    namespace: str = "wardle",
    name: str = "api-abc",
    *,
    service_name: str = "api",
    addresses: tuple[str, ...] = ("10.1.0.5",),
) -> Obj:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}],
        "endpoints": [{"addresses": list(addresses), "conditions": {"ready": True}}],
    }
