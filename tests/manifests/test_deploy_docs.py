"""docs/deploy.md (and the metric table of docs/reference.md): its commands work and its facts match
the code and the manifests.

Blocks marked `<!-- tested: NAME -->` are run as written, with kubeadm's /etc/kubernetes/pki
swapped for a throwaway front-proxy CA made the way kubeadm makes it (RSA 2048). A certificate
they issue must then do its job: the sample extension server, trusting that CA with allowed name
front-proxy-client, serves a request that presents it as the user named in X-Remote-User.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.exposition import generate_latest
from sample_apiserver.api import GROUP, VERSIONS
from sample_apiserver.options import SampleOptions
from sample_apiserver.server import SampleServer

from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.sources.problems import ManifestReport
from aggregator.web.http2.metrics import ConnectionMetrics, PenaltyMetrics
from aggregator.workers.metrics import WorkerMetrics
from tests.manifests.k8s import MANIFESTS, REPO
from tests.support.pki import PKI

GUIDE = REPO / "docs" / "deploy.md"
# The metric table lives in the reference; the guide links to it.
REFERENCE = REPO / "docs" / "reference.md"
KUBEADM_PKI = "/etc/kubernetes/pki"


def marked_block(name: str) -> str:
    """The fenced code block right after `<!-- tested: name -->`."""
    match = re.search(rf"<!-- tested: {re.escape(name)} -->\n```\w*\n(.*?)```", GUIDE.read_text(), re.S)
    assert match, f"docs/deploy.md has no block marked {name!r}"
    return match[1]


def run_block(script: str, cwd: Path) -> None:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{script}\n--- stderr:\n{result.stderr}"


@pytest.fixture
def kubeadm_pki(tmp_path: Path) -> Path:
    """A front-proxy CA like kubeadm's: RSA 2048, self-signed, CA:TRUE."""
    pki = tmp_path / "pki"
    pki.mkdir()
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=front-proxy-ca",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment",
            "-keyout",
            str(pki / "front-proxy-ca.key"),
            "-out",
            str(pki / "front-proxy-ca.crt"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return pki


async def _served_as(cert_dir: Path, kubeadm_pki: Path, pki: PKI) -> int:
    """The status a sample server trusting the front-proxy CA answers a request made with the
    issued front-proxy-client certificate, asserting user alice in group system:masters."""
    server = SampleServer(
        SampleOptions(
            bind_address="127.0.0.1",
            secure_port=0,
            tls_cert_file=pki.path("serving.crt"),
            tls_private_key_file=pki.path("serving.key"),
            requestheader_client_ca_file=str(kubeadm_pki / "front-proxy-ca.crt"),
            requestheader_allowed_names=["front-proxy-client"],
        )
    )
    await server.start()
    try:
        context = ssl.create_default_context(cafile=pki.path("ca.crt"))
        context.load_cert_chain(cert_dir / "front-proxy-client.crt", cert_dir / "front-proxy-client.key")
        headers = {"X-Remote-User": "alice", "X-Remote-Group": "system:masters"}
        url = f"{server.url}/apis/{GROUP}/{VERSIONS[0]}/namespaces/default/flunders"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=context, headers=headers) as response,
        ):
            return response.status
    finally:
        await server.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
@pytest.mark.parametrize("block", ["front-proxy-openssl", "front-proxy-python"])
async def test_the_front_proxy_certificate_recipes_issue_a_certificate_backends_accept(
    block: str, tmp_path: Path, kubeadm_pki: Path, pki: PKI
) -> None:
    script = marked_block(block).replace(KUBEADM_PKI, str(kubeadm_pki))
    script = script.replace("python3 -", f"{sys.executable} -")
    work = tmp_path / "work"
    work.mkdir()
    run_block(script, work)

    cert = x509.load_pem_x509_certificate((work / "front-proxy-client.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "front-proxy-client"
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert sorted(p.name for p in work.iterdir()) == ["front-proxy-client.crt", "front-proxy-client.key"]
    assert await _served_as(work, kubeadm_pki, pki) == 200


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
async def test_a_certificate_from_another_ca_is_refused_by_the_same_check(
    tmp_path: Path, kubeadm_pki: Path, pki: PKI
) -> None:
    # The acceptance above means something only if a front-proxy-client certificate from the
    # wrong CA (here: the demo PKI's own front-proxy CA) is refused.
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(pki.path("front-proxy-client.crt"), work)
    shutil.copy(pki.path("front-proxy-client.key"), work)
    assert await _served_as(work, kubeadm_pki, pki) == 401


def test_the_serving_certificate_recipe_covers_the_service_names(tmp_path: Path) -> None:
    script = marked_block("serving-certs-init").replace(
        "aggregator certs", f"{sys.executable} -m aggregator certs"
    )
    run_block(script, tmp_path)
    ca = x509.load_pem_x509_certificate((tmp_path / "gateway-pki/ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "gateway-pki/serving.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    service = yaml.safe_load((MANIFESTS / "base/service.yaml").read_text())["metadata"]
    assert f"{service['name']}.{service['namespace']}.svc" in dns
    assert "127.0.0.1" in ips  # the port-forward kubeconfig in the guide dials 127.0.0.1


def test_every_metric_in_the_table_is_served_under_that_name() -> None:
    first_cells = re.findall(
        r"^\| (`(?:aggregator|apiserver|leader_election)_[^|]*)\|", REFERENCE.read_text(), re.M
    )
    documented = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    exposed = set()
    # A single process's registry (with what its listener adds), and what the supervisor adds
    # with --workers N.
    metrics = GatewayMetrics.declare()
    ConnectionMetrics(metrics.registry)
    PenaltyMetrics(metrics.registry)  # the listener's flood penalty
    ManifestReport(list, metrics.registry)  # local mode's folder
    FlowControlMetrics(metrics.registry)  # API Priority and Fairness, on by default
    for registry in (metrics.registry, WorkerMetrics(2).registry):
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith("# TYPE "):
                exposed.add(line.split()[2])
    assert documented <= exposed, f"documented but not served: {sorted(documented - exposed)}"
    # Upstream's availability metrics, the ones alerts are built on, are always documented.
    assert {"aggregator_unavailable_apiservice", "aggregator_unavailable_apiservice_total"} <= documented
    assert "leader_election_master_status" in documented
    # ... and so are kube-apiserver's request metrics, the ones SLO rules are built on.
    assert {"apiserver_request_total", "apiserver_request_duration_seconds"} <= documented


def test_the_guide_shows_the_deployments_real_args_and_secret_names() -> None:
    text = GUIDE.read_text()
    deployment = yaml.safe_load((MANIFESTS / "base/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    match = re.search(r"What the Deployment passes.*?```text\n(.*?)```", text, re.S)
    assert match
    shown = [line.split("#", 1)[0].strip() for line in match[1].splitlines() if line.strip()]
    assert shown == args
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert f"create secret tls {volume['secret']['secretName']}" in text


def test_every_repository_path_the_guide_names_exists() -> None:
    for path in set(re.findall(r"(?<![\w/])manifests/[\w./-]*\w", GUIDE.read_text())):
        assert (REPO / path).exists(), path


def test_the_dashboard_table_has_every_row_and_panel_of_the_dashboard() -> None:
    """One table row per dashboard row, in order, and one `;`-separated item per panel."""
    import json

    board = json.loads((MANIFESTS / "overlays/components/monitoring/aggregator-dashboard.json").read_text())
    rows: list[tuple[str, int]] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            rows.append((panel["title"], len(panel.get("panels", []))))
        else:
            title, count = rows[-1]
            rows[-1] = (title, count + 1)
    table = re.search(r"\| row \| panels \|\n\|---\|---\|\n((?:\|.*\|\n)+)", GUIDE.read_text())
    assert table, "docs/deploy.md lost its dashboard table"
    documented = []
    for line in table[1].splitlines():
        row, panels = (cell.strip() for cell in line.strip("|").split("|"))
        documented.append((row, len(panels.split("; "))))
    assert documented == rows


def test_the_build_context_the_guide_names_is_the_dockerignore_allowlist() -> None:
    match = re.search(r"Nothing but (.*?) enters the build\s+context", GUIDE.read_text(), re.S)
    assert match, "docs/deploy.md no longer says what enters the build context"
    named = set(re.findall(r"`([^`]+)`", match[1]))
    allowed = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert named == allowed
