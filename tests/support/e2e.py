"""End-to-end plumbing: the sample wardle server behind a local-mode gateway, driven by real kubectl.

    async with WardleStack(pki, tmp_path) as stack:
        kubectl = stack.kubectl(binary)
        code, out, err = await kubectl("explain", "flunders")

`WardleStack` starts the sample server (serving certificate for `api.wardle.svc` from its own CA,
trusting the test PKI's front-proxy CA), registers it in the gateway's `--apiservices-dir` the way
a cluster would (both APIServices with that CA as caBundle, a Service on 127.0.0.1 and an
EndpointSlice, Available=True), starts the gateway, writes an admin kubeconfig for it, and waits
until the gateway's discovery and OpenAPI both list wardle.example.com.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml
from sample_apiserver import SampleOptions, SampleServer
from sample_apiserver.api import GROUP, VERSIONS

from aggregator.assembly import build_gateway
from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.commands.wardle import local_manifests
from aggregator.config import complete
from aggregator.runners.server import GatewayServer
from aggregator.tls.issue import KeyPair, issue_serving_cert, load_pair, new_ca, write_pair
from tests.support.gateway import local_options, running_gateway
from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.support.protocols import RequestLog

NAMESPACE = "wardle"
SERVICE = "api"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"

FLUNDER = """apiVersion: wardle.example.com/v1beta1
kind: Flunder
metadata:
  name: my-flunder
  labels: {app: demo}
spec:
  referenceType: Fischer
  fischerReference: fred
"""


def kubectl_binaries(*, every_version: bool = False) -> list[str]:
    """`kubectl` on the PATH and the oldest and newest `kubectl.1.<minor>` beside its real file
    (or all of them with `every_version`)."""
    main = shutil.which("kubectl")
    if main is None:
        return []
    folder = Path(os.path.realpath(main)).parent
    versioned = sorted(folder.glob("kubectl.1.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    chosen = [main]
    if versioned:
        chosen.extend(str(p) for p in (versioned if every_version else (versioned[0], versioned[-1])))
    return sorted(set(chosen))


async def kubectl_minor(binary: str) -> int:
    """The client's minor version, as the binary itself reports it (`kubectl version --client`)."""
    process = await asyncio.create_subprocess_exec(
        binary,
        "version",
        "--client",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    minor = json.loads(out)["clientVersion"]["minor"]
    return int(re.sub(r"\D.*", "", minor))


@dataclass
class LoggedRequest:
    """One request kubectl logged with `-v=8`: method, URL, request headers, response status."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


# kubectl <= 1.32: `] GET https://...`, `Request Headers:` + indented lines, `Response Status: 200 OK`.
# kubectl >= 1.33: `"Request" verb="GET" url="https://..." headers=<` + tab-indented lines + ` >`,
# then `"Response" status="200 OK" headers=<` + its own header lines.
_REQUEST = re.compile(
    r'\] (?:(GET|POST|PUT|PATCH|DELETE|HEAD) (https?://\S+)|"Request" verb="(\w+)" url="([^"]+)")'
)
_STATUS = re.compile(r'\] (?:Response Status: (\d{3})|"Response" status="(\d{3}))')
_HEADER = re.compile(r"^(?:\S.*\]\s{4,}|\t)([A-Za-z0-9-]+): (.*)$")


def logged_requests(stderr: str) -> list[LoggedRequest]:
    """The requests in kubectl's `-v=8` log, in either log format (request headers as printed)."""
    requests: list[LoggedRequest] = []
    for line in stderr.splitlines():
        if match := _REQUEST.search(line):
            method, url = (
                (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            )
            requests.append(LoggedRequest(method, url))
        elif requests and (match := _STATUS.search(line)):
            requests[-1].status = int(match.group(1) or match.group(2))
        elif requests and not requests[-1].status and (match := _HEADER.search(line)):
            requests[-1].headers[match.group(1)] = match.group(2).strip()
    return requests


class Kubectl:
    """One kubectl binary with one kubeconfig and its own HOME (a fresh discovery and HTTP cache).

    With a `RequestLog` of the gateway it talks to, every call also checks that kubectl's requests
    reached the gateway over the protocol it should have negotiated (HTTP/2 by default).
    """

    def __init__(self, binary: str, config: Path, home: Path, requests: RequestLog | None = None) -> None:
        self.binary = binary
        self.config = config
        self.home = home
        self.requests = requests
        home.mkdir(parents=True, exist_ok=True)

    async def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> tuple[int, str, str]:
        mark = self.requests.mark() if self.requests is not None else 0
        process = await asyncio.create_subprocess_exec(
            self.binary,
            "--kubeconfig",
            str(self.config),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HOME": str(self.home)},
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        code = process.returncode or 0
        if check:
            assert code == 0, f"kubectl {' '.join(args)} failed ({code}): {err.decode()}"
        if self.requests is not None:
            self.requests.check_kubectl(mark, args)
        return code, out.decode(), err.decode()


def wardle_manifests(ca_bundle: bytes, port: int, *, address: str = "127.0.0.1") -> list[dict[str, Any]]:
    """The sample's registration (as the demo writes it), with both APIServices marked Available so
    tests do not wait for the availability checker's first round."""
    docs = local_manifests(ca_bundle, port, address=address, namespace=NAMESPACE, service=SERVICE)
    for doc in docs:
        if doc["kind"] == "APIService":
            doc["status"] = {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]}
    return docs


class WardleStack:
    """Sample server + local-mode gateway + admin kubeconfig; an async context manager."""

    def __init__(
        self,
        pki: PKI,
        workdir: Path,
        *,
        gateway_options: dict[str, Any] | None = None,
        sample_options: dict[str, Any] | None = None,
        ready_timeout: float = 20.0,
    ) -> None:
        self.pki = pki
        self.workdir = workdir
        self.gateway_options = gateway_options or {}
        self.sample_options = sample_options or {}
        self.ready_timeout = ready_timeout
        self.apiservices_dir = workdir / "apiservices"
        self.sample: SampleServer | None = None
        self.gateway: GatewayServer | None = None
        self.backend_ca: KeyPair | None = None
        self.kubeconfig = workdir / "admin.kubeconfig"
        self._gateway_cm: Any = None
        self._homes = 0
        self.requests = RequestLog()

    # --- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> WardleStack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        if exc_type is None:
            self.requests.verify_seen()

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.apiservices_dir.mkdir(exist_ok=True)
        certs = self.workdir / "wardle-certs"
        certs.mkdir(exist_ok=True)
        self.backend_ca = new_ca("wardle-ca")
        write_pair(certs, "serving", issue_serving_cert(self.backend_ca, [SERVER_NAME]))
        options = SampleOptions(
            bind_address="127.0.0.1",
            secure_port=0,
            tls_cert_file=str(certs / "serving.crt"),
            tls_private_key_file=str(certs / "serving.key"),
            requestheader_client_ca_file=self.pki.path("front-proxy-ca.crt"),
            requestheader_allowed_names=["front-proxy-client"],
        )
        self.sample = SampleServer(replace(options, **self.sample_options))
        port = await self.sample.start()
        self.register(port)
        gateway_options = local_options(self.pki, str(self.apiservices_dir), **self.gateway_options)
        config = complete(gateway_options)
        gateway = build_gateway(config)
        self.requests.attach(gateway)
        self._gateway_cm = running_gateway(gateway_options, gateway)
        self.gateway = await self._gateway_cm.__aenter__()
        self.requests.expect(self.gateway)
        write_kubeconfig(
            self.kubeconfig,
            kubeconfig(
                self.url, Path(self.pki.path("ca.crt")).read_bytes(), load_pair(self.pki.dir, "admin")
            ),
        )
        await self.wait_ready()

    async def stop(self) -> None:
        if self._gateway_cm is not None:
            cm, self._gateway_cm = self._gateway_cm, None
            await cm.__aexit__(None, None, None)
        if self.sample is not None:
            sample, self.sample = self.sample, None
            await sample.stop()

    def register(self, port: int) -> Path:
        """(Re)write the registration manifests for a sample server listening on `port`."""
        assert self.backend_ca is not None
        path = self.apiservices_dir / "wardle.yaml"
        docs = wardle_manifests(self.backend_ca.cert_pem, port)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    # --- using it ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def kubectl(self, binary: str = "kubectl") -> Kubectl:
        """A kubectl runner as the admin user, with a fresh HOME (no cached discovery or OpenAPI)."""
        self._homes += 1
        return Kubectl(binary, self.kubeconfig, self.workdir / f"home-{self._homes}", self.requests)

    async def get(
        self, path: str, *, headers: dict[str, str] | None = None, cert: str = "admin"
    ) -> tuple[int, dict[str, str], bytes]:
        """A GET to the gateway as `cert`'s user (no redirects followed)."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                self.url + path,
                headers=headers or {},
                ssl=self.pki.client_context(cert),
                allow_redirects=False,
            ) as resp,
        ):
            return resp.status, dict(resp.headers), await resp.read()

    async def wait_for(self, predicate: Callable[[], Any], what: str) -> None:
        await until_async(predicate, self.ready_timeout, what)

    async def wait_ready(self) -> None:
        """Until /apis lists wardle.example.com and /openapi/v3 lists both its group-versions."""
        wanted = {f"apis/{GROUP}/{v}" for v in VERSIONS}

        async def ready() -> bool:
            status, _, body = await self.get(f"/apis/{GROUP}")
            if status != 200:
                return False
            status, _, body = await self.get("/openapi/v3")
            if status != 200:
                return False
            return wanted <= set(yaml.safe_load(body).get("paths", {}))

        await self.wait_for(ready, "wardle.example.com in discovery and OpenAPI")
