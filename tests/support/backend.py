"""A fake extension API server over real TLS, and the manifests that register it.

The server demands a client certificate signed by the front-proxy CA (as an extension API server
configured with `--requestheader-client-ca-file` does), records every request exactly as it
arrived (raw path, every header line, the peer's CN), and answers from per-path handlers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import select
import socket
import ssl
import struct
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from aggregator.contracts import Availability
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import KeyPair, issue_serving_cert, new_ca, write_pair
from tests.support.polling import until
from tests.support.threaded import ThreadedTLSServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GROUP = "demo.example.com"
VERSION = "v1"
APISERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "demo"
SERVICE = "api"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"
PREFIX = f"/apis/{GROUP}/{VERSION}"


@dataclass
class Received:
    method: str
    raw_path: str
    headers: list[tuple[str, str]]
    peer_cn: str
    body_size: int = 0
    connection: int = 0  # identifies the TCP connection the request came on

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def one(self, name: str) -> str | None:
        values = self.all(name)
        assert len(values) <= 1, f"{name} sent {len(values)} times: {values}"
        return values[0] if values else None


@dataclass
class BackendPKI:
    """A CA for extension servers and serving pairs signed by it, written under `dir`."""

    dir: Path
    ca: KeyPair
    other_ca: KeyPair

    def serving(self, stem: str, hosts: list[str], *, ca: KeyPair | None = None) -> tuple[str, str]:
        pair = issue_serving_cert(ca or self.ca, hosts)
        write_pair(self.dir, stem, pair)
        return str(self.dir / f"{stem}.crt"), str(self.dir / f"{stem}.key")


def make_backend_pki(directory: Path) -> BackendPKI:
    return BackendPKI(directory, new_ca("extension-ca"), new_ca("unrelated-ca"))


async def echo(request: web.Request) -> web.StreamResponse:
    """What the backend saw: path, identity headers."""
    return web.json_response(
        {
            "path": request.raw_path,
            "user": request.headers.get("X-Remote-User"),
            "groups": request.headers.getall("X-Remote-Group", []),
        }
    )


class Listener(socket.socket):
    """A listening socket that remembers the connections it accepts, so that they can all be cut.

    aiohttp's cleanup closes the connections its server tracks, and it tracks one only once its
    TLS handshake has finished: a connection accepted before the listener closed but still in its
    handshake then is served afterwards. A process that goes away leaves none open. (On uvloop,
    which accepts in libuv, nothing passes through `accept` and only aiohttp's cleanup applies.)
    """

    def __init__(self, host: str, port: int) -> None:
        super().__init__(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.accepted: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds the same port
        self.bind((host, port))
        self.listen(128)
        self.setblocking(False)

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        self.accepted.add(conn)
        return conn, address

    def cut(self) -> None:
        """End every accepted connection still open: the peer reads EOF at once."""
        for conn in list(self.accepted):
            if conn.fileno() != -1:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@dataclass
class FakeBackend:
    cert_file: str
    key_file: str
    front_proxy_ca_file: str
    require_client_cert: bool = True
    received: list[Received] = field(default_factory=list)
    routes: dict[str, Handler] = field(default_factory=dict)
    default: Handler = echo
    port: int = 0
    connections: int = 0
    host: str = "127.0.0.1"  # where it listens ("::1" for IPv6 tests)
    _runner: web.AppRunner | None = None
    _listener: Listener | None = None

    def seen_by(self, user: str) -> list[Received]:
        """Requests made as `user` (the gateway's own discovery calls come as system:kube-aggregator)."""
        return [r for r in self.received if user in r.all("X-Remote-User")]

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.front_proxy_ca_file)
        return ctx

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        peer = ssl_object.getpeercert() if ssl_object is not None else None
        cn = ""
        for rdn in (peer or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        self.received.append(
            Received(
                request.method,
                request.raw_path,
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers],
                cn,
                connection=id(request.transport),
            )
        )
        handler = self.routes.get(request.path, self.default)
        return await handler(request)

    async def start(self) -> int:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        self._listener = Listener(self.host, self.port)
        site = web.SockSite(self._runner, self._listener, ssl_context=self.context())
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # (host, port) of the listening socket
        return self.port

    async def stop(self) -> None:
        """Stop listening and end every connection, as a backend whose process went away would."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            self._listener.cut()  # after the cleanup, which let requests in progress finish
            self._listener = None


def apiservice_manifest(
    *,
    port: int,
    ca_pem: bytes | None,
    group: str = GROUP,
    version: str = VERSION,
    namespace: str = NAMESPACE,
    service: str = SERVICE,
    available: bool = True,
    insecure: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "group": group,
        "version": version,
        "service": {"namespace": namespace, "name": service, "port": port},
        "groupPriorityMinimum": 1000,
        "versionPriority": 15,
    }
    if ca_pem:
        spec["caBundle"] = base64.b64encode(ca_pem).decode()
    if insecure:
        spec["insecureSkipTLSVerify"] = True
    status = "True" if available else "False"
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"},
        "spec": spec,
        "status": {"conditions": [{"type": "Available", "status": status, "reason": "Passed"}]},
    }


def service_manifest(
    *,
    port: int,
    namespace: str = NAMESPACE,
    name: str = SERVICE,
    cluster_ip: str = "127.0.0.1",
    type_: str = "ClusterIP",
    external_name: str = "",
    port_name: str = "https",
    target_port: int | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": type_}
    if type_ == "ExternalName":
        spec["externalName"] = external_name
    else:
        spec["clusterIP"] = cluster_ip
    spec["ports"] = [{"name": port_name, "port": port, "targetPort": target_port or port}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


def endpointslice_manifest(
    name: str,
    endpoints: list[tuple[str, bool | None]],
    *,
    port: int,
    port_name: str = "https",
    namespace: str = NAMESPACE,
    service: str = SERVICE,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    eps = []
    for address, ready in endpoints:
        ep: dict[str, Any] = {"addresses": [address]}
        if ready is not None:
            ep["conditions"] = {"ready": ready}
        eps.append(ep)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": address_type,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": eps,
    }


def backend_service(port: int, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Service at 127.0.0.1:`port` and its EndpointSlice (availability checks look for it)."""
    return service_manifest(port=port, **kwargs), endpointslice_manifest(
        "api-1", [("127.0.0.1", True)], port=port
    )


class AlwaysAvailable:
    """An availability view that says yes: for tests of the proxy's own failure paths, which the
    availability checker would otherwise pre-empt with 503 `service unavailable`."""

    def is_available(self, name: str) -> bool:
        return True

    def reason(self, name: str) -> str:
        return "Passed"

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Nothing ever changes."""


def force_available(server: GatewayServer) -> None:
    """The proxy treats every APIService as available, whatever the checker finds (for tests of
    the proxy's own failure answers)."""
    use_availability(server, AlwaysAvailable())


def use_availability(server: GatewayServer, view: Availability) -> None:
    """The proxy asks `view` whether each APIService is available, from now on."""
    proxy = server.gateway.proxy
    proxy.availability = view
    for svc in server.gateway.store.apiservices():
        proxy.availability_changed(svc.name)


async def wait_available(server: GatewayServer, name: str = APISERVICE, timeout: float = 10.0) -> None:
    await until(lambda: server.gateway.control.availability.is_available(name), timeout)


def write_manifests(folder: Path, name: str, *docs: dict[str, Any]) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def status_of(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    assert doc["kind"] == "Status", doc
    return dict(doc)


Respond = Callable[["RawBackend", asyncio.StreamReader, asyncio.StreamWriter, Received], Awaitable[None]]


def parse_request_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return method, target, headers


@dataclass
class RawBackend:
    """A TLS server speaking raw HTTP/1.1, for upgrades: `respond` decides what each request gets.

    It keeps reading request heads on a connection until the peer closes it, so a test can tell
    whether a second request ever arrived on a connection that should have been dropped.
    """

    cert_file: str
    key_file: str
    front_proxy_ca_file: str
    respond: Respond
    received: list[Received] = field(default_factory=list)
    connections: int = 0
    # Connections that carried an upgrade request (the gateway's discovery calls are not counted).
    upgrade_connections: set[int] = field(default_factory=set)
    port: int = 0
    _server: asyncio.Server | None = None

    def seen_by(self, user: str) -> list[Received]:
        return [r for r in self.received if user in r.all("X-Remote-User")]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = writer.get_extra_info("peercert") or {}
        cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                    return
                method, target, headers = parse_request_head(head)
                received = Received(method, target, headers, cn)
                self.received.append(received)
                if received.one("Upgrade") is None:
                    # The gateway's own discovery calls: not what these tests are about.
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                self.upgrade_connections.add(id(writer))
                await self.respond(self, reader, writer, received)
        finally:
            writer.close()

    async def start(self) -> int:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(self.front_proxy_ca_file)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def _encrypted_records(data: bytes | bytearray) -> int:
    """How many TLS records of type application_data (23) `data` holds (TLS 1.3 encrypts into those)."""
    count, offset = 0, 0
    while offset + 5 <= len(data):
        if data[offset] == 23:
            count += 1
        offset += 5 + int.from_bytes(data[offset + 3 : offset + 5], "big")
    return count


class LostAlertBackend(ThreadedTLSServer):
    """A TLS 1.3 server that refuses the gateway's client certificate, as a loaded gateway sees it.

    A Go server that refuses a client certificate sends an alert after the handshake and closes.
    The gateway has already written its request by then, so the close meets unread data and
    becomes a reset, which can overtake the alert: the client library reports "connection reset
    by peer" (`lost="reset"`) or, when the server shut down cleanly, "EOF" (`lost="eof"`). This
    server plays that outcome deterministically: a connection that sends data right after the
    handshake gets no alert (a reset, or a clean close), while one that sends nothing (the
    gateway's second look) gets the alert. Blocking sockets on a thread, TLS through memory BIOs,
    so the server decides what reaches the wire.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str, *, lost: str = "reset") -> None:
        assert lost in ("reset", "eof")
        self.lost = lost
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(cert_file, key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca_file)
        self.alerts_sent = 0
        self.alerts_lost = 0
        super().__init__(context, name="lost-alert-backend")

    def handle(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True)
        received = bytearray()  # every byte from the client, to tell its request from its handshake
        while True:
            try:
                tls.do_handshake()
                return  # a certificate this server trusts: not what it is for
            except ssl.SSLWantReadError:
                conn.sendall(outgoing.read())
                data = conn.recv(65536)
                if not data:
                    return
                received += data
                incoming.write(data)
            except ssl.SSLError:
                break
        alert = outgoing.read()
        # A TLS 1.3 client's second flight is three encrypted records (Certificate,
        # CertificateVerify, Finished); a fourth is application data: the gateway's request.
        deadline = time.monotonic() + 0.2
        while _encrypted_records(received) <= 3 and (left := deadline - time.monotonic()) > 0:
            if not select.select([conn], [], [], left)[0]:
                break
            data = conn.recv(65536)
            if not data:
                break
            received += data
        if _encrypted_records(received) > 3:  # the request went out: the alert is lost
            self.alerts_lost += 1
            if self.lost == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.shutdown(socket.SHUT_RDWR)  # everything was read: a clean FIN, seen as EOF
            return
        conn.sendall(alert)
        self.alerts_sent += 1
