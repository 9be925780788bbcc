"""`aggregator check`: each hop with ✓ or ✗ and its detail, exit 0 only when every hop passes."""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from aggregator.commands.certs import kubeconfig, write_kubeconfig
from aggregator.commands.check import check_options, kubeconfig_from_environment, run_check
from aggregator.commands.cli import build_parser
from aggregator.config import complete
from aggregator.tls.issue import load_pair
from aggregator.util.flags import ConfigError
from tests.availability.support import StartBackend, backends
from tests.conftest import StartGateway
from tests.flowcontrol.support import flow_schema, priority_level
from tests.support.backend import (
    APISERVICE,
    SERVER_NAME,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    make_backend_pki,
    service_manifest,
)
from tests.support.fakekube import FakeKube
from tests.support.pki import PKI
from tests.support.ports import free_port

pytestmark = pytest.mark.long(10)

DISCOVERY = "/apis/demo.example.com/v1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend_pki(tmp_path_factory: pytest.TempPathFactory) -> BackendPKI:
    return make_backend_pki(tmp_path_factory.mktemp("check-backend-pki"))


@pytest.fixture
async def start_backend(backend_pki: BackendPKI, pki: PKI) -> AsyncIterator[StartBackend]:
    async with backends(backend_pki, pki) as start:
        yield start


def demo_objects(port: int, ca_pem: bytes | None, **apiservice: Any) -> list[dict[str, Any]]:
    svc = apiservice_manifest(port=port, ca_pem=ca_pem, **apiservice)
    del svc["status"]
    return [
        svc,
        service_manifest(port=port),
        endpointslice_manifest("api-1", [("127.0.0.1", True)], port=port),
    ]


def write(folder: Path, stem: str, docs: list[dict[str, Any]]) -> None:
    (folder / f"{stem}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))


def serve_resources(backend: FakeBackend) -> None:
    async def resources(_request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "demo.example.com/v1",
                "resources": [{"name": "things", "namespaced": True, "kind": "Thing", "verbs": ["get"]}],
            }
        )

    backend.routes[DISCOVERY] = resources


def proxy_flags(pki: PKI) -> list[str]:
    return [
        "--proxy-client-cert-file",
        pki.path("front-proxy-client.crt"),
        "--proxy-client-key-file",
        pki.path("front-proxy-client.key"),
    ]


async def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """`python -m aggregator check ...` as a user runs it (UTF-8 terminal, no colour), this
    checkout's code whatever the working directory."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aggregator",
        "check",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_inline(*argv: str) -> tuple[int, str, str]:
    """The same command in-process (faster), output captured."""
    args = build_parser().parse_args(["check", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = await run_check(complete(check_options(args)), args.name, out, err)
    return code, out.getvalue(), err.getvalue()


def hop_line(out: str, hop: str) -> str:
    """The line of one hop, runs of spaces squeezed: `✓ tls certificate verified for ...`."""
    lines = [" ".join(line.split()) for line in out.splitlines() if line.split()[1:2] == [hop]]
    assert len(lines) == 1, (hop, out)
    return lines[0]


async def test_every_hop_passes(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    backend = await start_backend(hosts=[SERVER_NAME, "localhost"])
    serve_resources(backend)
    write(apiservices_dir, "demo", demo_objects(backend.port, backend_pki.ca.cert_pem))
    code, out, err = await run_cli(APISERVICE, "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    assert code == 0, out + err
    assert out.startswith(f"APIService {APISERVICE} (demo/api:{backend.port})\n")
    assert hop_line(out, "service") == "✓ service demo/api exists (type ClusterIP, cluster IP 127.0.0.1)"
    assert "✓ port " in out and f'port {backend.port} exists (name "https"' in out
    assert f'1 ready address with port name "https": 127.0.0.1:{backend.port}' in hop_line(out, "endpoints")
    assert f"127.0.0.1:{backend.port}, the cluster IP of service demo/api" in hop_line(out, "address")
    assert hop_line(out, "tls") == f"✓ tls certificate verified for {SERVER_NAME}"
    assert f"expected name: {SERVER_NAME}" in out
    assert f"certificate names: {SERVER_NAME}, localhost" in out
    assert "trusted CA: spec.caBundle: CN=extension-ca" in out
    assert "GET /apis/demo.example.com/v1 as system:kube-aggregator (system:masters): 200 OK" in hop_line(
        out, "http"
    )
    assert "APIResourceList for demo.example.com/v1: 1 resource: things" in hop_line(out, "discovery")
    assert "Available: True\n  all checks passed" in out
    assert "✗" not in out


async def test_backend_down_exits_1_naming_the_hop(
    backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    port = free_port()
    write(apiservices_dir, "demo", demo_objects(port, backend_pki.ca.cert_pem))
    code, out, _ = await run_cli(APISERVICE, "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    assert code == 1
    assert hop_line(out, "connect") == (f"✗ connect dial tcp 127.0.0.1:{port}: connect: connection refused")
    assert hop_line(out, "tls") == "· tls not reached"
    assert hop_line(out, "http") == "· http not reached"
    assert "Available: False (FailedDiscoveryCheck)" in out
    url = f"https://127.0.0.1:{port}{DISCOVERY}"
    assert f"  failing or missing response from {url}: " in out


async def test_all_prints_a_table(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    backend = await start_backend()
    serve_resources(backend)
    write(apiservices_dir, "demo", demo_objects(backend.port, backend_pki.ca.cert_pem))
    missing = apiservice_manifest(port=443, ca_pem=None, group="metrics.k8s.io", version="v1beta1")
    missing["spec"]["service"] = {"namespace": "kube-system", "name": "metrics-server", "port": 443}
    local = apiservice_manifest(port=443, ca_pem=None, group="apps")
    del local["spec"]["service"]
    write(apiservices_dir, "others", [missing, local])
    code, out, _ = await run_cli("--all", "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    assert code == 1
    rows = [line.split(None, 4) for line in out.splitlines()]
    assert rows[0] == ["NAME", "SERVICE", "AVAILABLE", "HOP", "DETAIL"]
    assert rows[1] == ["✓", "v1.apps", "Local", "True"]
    assert rows[2] == ["✓", APISERVICE, f"demo/api:{backend.port}", "True"]
    assert out.splitlines()[3].split(None, 5) == [
        "✗",
        "v1beta1.metrics.k8s.io",
        "kube-system/metrics-server:443",
        "False",
        "(ServiceNotFound)",
        "service   service kube-system/metrics-server not found",
    ]


async def test_all_names_every_file_not_loaded_and_fails(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    """Every APIService that loaded passes; the files that did not fail the check, each named."""
    backend = await start_backend()
    serve_resources(backend)
    write(apiservices_dir, "demo", demo_objects(backend.port, backend_pki.ca.cert_pem))
    args = ("--all", "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    code, out, err = await run_cli(*args)
    assert code == 0 and "Manifests" not in out, out + err
    other = apiservice_manifest(port=443, ca_pem=None, group="other.example.com")
    del other["status"]
    typo = yaml.safe_dump(other).replace("groupPriorityMinimum", "groupPriorityMinimun")
    (apiservices_dir / "a-typo.yaml").write_text(typo)
    (apiservices_dir / "b-case.yaml").write_text(yaml.safe_dump(other).replace("kind: APIService", "kind: ApiService"))
    (apiservices_dir / "c-broken.yaml").write_text("apiVersion: v1\nkind: [unclosed\n")
    (apiservices_dir / "d-deployment.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"}}
    (apiservices_dir / "e-rbac.yaml").write_text(yaml.safe_dump({**role, "rules": [{"verbs": [], "apiGroups": [""], "resources": ["pods"]}]}))
    # API Priority and Fairness's objects: the valid level loads, the invalid FlowSchema is named
    bad_schema = flow_schema("for-bob", "tenants", users=("bob",))
    bad_schema["spec"]["matchingPrecedence"] = -5
    (apiservices_dir / "f-apf.yaml").write_text(yaml.safe_dump_all([priority_level("tenants"), bad_schema]))
    code, out, err = await run_cli(*args)
    assert code == 1, out + err
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["✓", APISERVICE, f"demo/api:{backend.port}", "True"]
    start = lines.index("Manifests the gateway does not load (6):")
    folder = str(apiservices_dir)
    broken = lines.pop(start + 3)  # the parser's words differ between libyaml and PyYAML's own
    assert broken.startswith(f"✗ {folder}/c-broken.yaml:3: ") and broken.endswith("']' (file not loaded)")
    assert lines[start + 1 :] == [
        f'✗ {folder}/a-typo.yaml: APIService in version "v1" cannot be handled as a APIService: strict decoding '
        'error: unknown field "spec.groupPriorityMinimun" (refused)',
        f'✗ {folder}/b-case.yaml: no matches for kind "ApiService" in version "apiregistration.k8s.io/v1": did '
        'you mean "APIService"? (refused)',
        f"✗ {folder}/d-deployment.yaml: apps/v1 Deployment (skipped: the gateway reads only APIService "
        "(apiregistration.k8s.io/v1), Service (v1), EndpointSlice (discovery.k8s.io/v1), Role, ClusterRole, "
        "RoleBinding and ClusterRoleBinding (rbac.authorization.k8s.io/v1), and FlowSchema and "
        "PriorityLevelConfiguration (flowcontrol.apiserver.k8s.io/v1))",
        f'✗ {folder}/e-rbac.yaml: ClusterRole.rbac.authorization.k8s.io "reader" is invalid: rules[0].verbs: '
        "Required value: verbs must contain at least one value (refused)",
        f'✗ {folder}/f-apf.yaml: FlowSchema.flowcontrol.apiserver.k8s.io "for-bob" is invalid: '
        "spec.matchingPrecedence: Invalid value: -5: must be a positive value (refused)",
    ]
    # One APIService by name: the folder's problems are warnings, its verdict the exit code.
    code, out, err = await run_cli(APISERVICE, *args[1:])
    assert code == 0, out + err
    assert f"warning: {folder}/c-broken.yaml:3: " in err


async def test_tls_detail_for_the_wrong_ca(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    backend = await start_backend()
    write(apiservices_dir, "demo", demo_objects(backend.port, backend_pki.other_ca.cert_pem))
    code, out, _ = await run_inline(APISERVICE, "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    assert code == 1
    assert "tls: failed to verify certificate: x509: certificate signed by unknown authority" in hop_line(
        out, "tls"
    )
    assert f"expected name: {SERVER_NAME}" in out
    assert f"certificate names: {SERVER_NAME}" in out
    assert "certificate issuer: CN=extension-ca" in out
    assert "trusted CA: spec.caBundle: CN=unrelated-ca" in out


async def test_a_body_that_is_not_discovery_fails_the_last_hop(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, apiservices_dir: Path
) -> None:
    backend = await start_backend()

    async def healthz_style(_request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    backend.routes[DISCOVERY] = healthz_style
    write(apiservices_dir, "demo", demo_objects(backend.port, backend_pki.ca.cert_pem))
    code, out, _ = await run_inline(APISERVICE, "--apiservices-dir", str(apiservices_dir), *proxy_flags(pki))
    assert code == 1
    assert "the body is not JSON" in hop_line(out, "discovery")
    assert "Available: True" in out  # upstream only needs a 2xx
    assert "the discovery hop fails for clients" in out


async def test_unknown_apiservice(pki: PKI, apiservices_dir: Path) -> None:
    code, out, err = await run_inline("v1.nope.example.com", "--apiservices-dir", str(apiservices_dir))
    assert (code, out) == (1, "")
    assert 'apiservice "v1.nope.example.com" not found' in err
    assert "no --proxy-client-cert-file" in err


def test_name_or_all_is_required(apiservices_dir: Path) -> None:
    for argv in (
        ["--apiservices-dir", str(apiservices_dir)],
        ["x", "--all", "--apiservices-dir", str(apiservices_dir)],
    ):
        args: argparse.Namespace = build_parser().parse_args(["check", *argv])
        with pytest.raises(ConfigError, match="give one APIService name, or --all"):
            check_options(args)


async def test_objects_from_kube_apiserver(
    fake_kube: FakeKube, start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI
) -> None:
    backend = await start_backend()
    serve_resources(backend)
    for doc, resource in zip(
        demo_objects(backend.port, backend_pki.ca.cert_pem),
        ("apiservices", "services", "endpointslices"),
        strict=True,
    ):
        fake_kube.add_object(resource, doc)
    assert fake_kube.kubeconfig is not None
    # The fake cluster's backend listens on loopback, which kube mode denies unless told otherwise.
    code, out, err = await run_inline(
        APISERVICE,
        "--kubeconfig",
        str(fake_kube.kubeconfig),
        "--backend-deny-cidrs",
        "169.254.0.0/16",
        *proxy_flags(pki),
    )
    assert code == 0, out + err
    assert "Available: True" in out
    assert fake_kube.counts[("list", "services")] == 1


async def test_services_that_cannot_be_listed_are_a_service_access_error(
    fake_kube: FakeKube, backend_pki: BackendPKI, pki: PKI
) -> None:
    fake_kube.add_object("apiservices", demo_objects(443, backend_pki.ca.cert_pem)[0])

    async def forbidden(_request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": 'services is forbidden: User "gateway" cannot list resource "services" in API group "" '
                "at the cluster scope",
                "reason": "Forbidden",
                "code": 403,
            },
            status=403,
        )

    fake_kube.add_route("GET", "/api/v1/services", forbidden)
    assert fake_kube.kubeconfig is not None
    code, out, _ = await run_inline(APISERVICE, "--kubeconfig", str(fake_kube.kubeconfig), *proxy_flags(pki))
    assert code == 1
    assert "Available: Unknown (ServiceAccessError)" in out
    assert (
        '  service/api in "demo" cannot be checked due to: services is forbidden: User "gateway" cannot list '
        'resource "services"'
    ) in out
    assert "cannot read Services: services is forbidden" in hop_line(out, "service")


# --- defaults found on the user's behalf ---------------------------------------------------------------


async def test_local_mode_finds_the_proxy_client_pair_beside_the_manifests(
    start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, tmp_path: Path
) -> None:
    """The demo's layout, run from the demo's folder: no --proxy-client-* flags needed."""
    certs = tmp_path / "certs"
    manifests = certs / "demo" / "apiservices"
    manifests.mkdir(parents=True)
    for suffix in ("crt", "key"):
        (certs / f"front-proxy-client.{suffix}").write_bytes(
            Path(pki.path(f"front-proxy-client.{suffix}")).read_bytes()
        )
    backend = await start_backend()  # demands a front-proxy client certificate
    serve_resources(backend)
    write(manifests, "demo", demo_objects(backend.port, backend_pki.ca.cert_pem))
    code, out, err = await run_cli("--all", "--apiservices-dir", "certs/demo/apiservices", cwd=tmp_path)
    assert code == 0, out + err
    assert "note: using the front-proxy client certificate certs/front-proxy-client.crt" in err
    assert "no --proxy-client-cert-file" not in err
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [
        ["✓", APISERVICE, "demo/api:" + str(backend.port)]
    ]


def test_the_kubeconfig_is_found_as_kubectl_finds_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first, second = tmp_path / "first", tmp_path / "second"
    second.write_text("apiVersion: v1\n")
    listed = os.pathsep.join([str(first), str(second)])
    assert kubeconfig_from_environment({"KUBECONFIG": listed}, home) == str(second)
    assert kubeconfig_from_environment({}, home) is None
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("apiVersion: v1\n")
    assert kubeconfig_from_environment({}, home) == str(home / ".kube" / "config")
    # $KUBECONFIG set: ~/.kube/config is not a fallback (client-go's precedence)
    assert kubeconfig_from_environment({"KUBECONFIG": str(first)}, home) is None


async def test_kubeconfig_from_the_environment(
    fake_kube: FakeKube, start_backend: StartBackend, backend_pki: BackendPKI, pki: PKI, tmp_path: Path
) -> None:
    backend = await start_backend()
    serve_resources(backend)
    for doc, resource in zip(
        demo_objects(backend.port, backend_pki.ca.cert_pem),
        ("apiservices", "services", "endpointslices"),
        strict=True,
    ):
        fake_kube.add_object(resource, doc)
    listed = os.pathsep.join([str(tmp_path / "missing"), str(fake_kube.kubeconfig)])
    # The fake cluster's backend listens on loopback, which kube mode denies unless told otherwise.
    deny = ["--backend-deny-cidrs", "169.254.0.0/16"]
    code, out, err = await run_cli(APISERVICE, *deny, *proxy_flags(pki), env={"KUBECONFIG": listed})
    assert code == 0, out + err
    assert f"note: using the kubeconfig {fake_kube.kubeconfig}" in err
    assert fake_kube.counts[("list", "services")] == 1


async def test_a_local_mode_gateway_as_kubeconfig_gets_a_hint(
    start_gateway: StartGateway, pki: PKI, apiservices_dir: Path, backend_pki: BackendPKI, tmp_path: Path
) -> None:
    """`export KUBECONFIG=certs/demo.kubeconfig; aggregator check --all`: the gateway lists APIServices
    but serves no Services; say what to run instead."""
    write(apiservices_dir, "demo", demo_objects(free_port(), backend_pki.ca.cert_pem))
    server = await start_gateway()
    config = tmp_path / "gateway.kubeconfig"
    write_kubeconfig(
        config, kubeconfig(server.url, Path(pki.path("ca.crt")).read_bytes(), load_pair(pki.dir, "admin"))
    )
    code, out, err = await run_inline("--all", "--kubeconfig", str(config), *proxy_flags(pki))
    assert code == 1
    assert (
        "the server does not serve Services: if it is a gateway in local mode, check its manifests with "
        "--apiservices-dir instead"
    ) in err
    assert APISERVICE in out
