"""manifests/: every object is valid Kubernetes, kubectl accepts it, and the Deployment is what a
careful operator would run (least privilege, two spread replicas, probes, locked-down pods).

What is checked offline, and against what (see tests/manifests/k8s.py):
- YAML parses; every object's shape matches the official client's models (upstream OpenAPI,
  release-1.37): unknown fields, wrong types and missing required fields fail;
- every apiVersion/kind is a resource Kubernetes 1.37 serves, with the right scope;
- `kubectl kustomize` builds the base, both overlays and the example;
- `kubectl apply --dry-run=client --validate=false` accepts each file and each kustomization,
  against a loopback discovery server (kubectl's own decoding, kind-to-resource mapping and
  namespace handling; nothing is sent).
"""

from __future__ import annotations

import copy
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.commands.cli import build_parser
from aggregator.config import Options, complete, options_from_args
from aggregator.runners.serving import shutdown_bound
from tests.conftest import StartGateway
from tests.manifests.k8s import (
    KUBECTL,
    MANIFESTS,
    Obj,
    describe,
    find,
    kubectl_apply_dry_run,
    kustomization_dirs,
    kustomize,
    load_documents,
    manifest_files,
    resource_for,
    schema_errors,
)
from tests.support.pki import PKI

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

NAMESPACE = "aggregator-system"
GATEWAY_LABELS = {"app.kubernetes.io/name": "aggregator", "app.kubernetes.io/component": "gateway"}
WORKLOAD_KINDS = {"Deployment"}
RBAC_ROLE_KINDS = {"Role", "ClusterRole"}


def _documents() -> list[tuple[Path, Obj]]:
    return [(path, doc) for path in manifest_files() for doc in load_documents(path.read_text())]


def _doc_id(item: tuple[Path, Obj]) -> str:
    path, doc = item
    return f"{path.relative_to(MANIFESTS)}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


DOCUMENTS = _documents()


# --- every file -------------------------------------------------------------------------------------


def test_the_layout_has_a_base_two_overlays_and_the_example() -> None:
    dirs = {str(d.relative_to(MANIFESTS)) for d in kustomization_dirs()}
    assert dirs >= {
        ".",
        "base",
        "overlays/write-apiservice-status",
        "overlays/impersonate",
        "examples/wardle",
    }


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_manifest_parses_into_named_objects(path: Path) -> None:
    docs = load_documents(path.read_text())
    assert docs, f"{path} holds no object"
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc.get("metadata", {}).get("name"), doc


@pytest.mark.parametrize("item", DOCUMENTS, ids=_doc_id)
def test_every_object_matches_the_kubernetes_schema(item: tuple[Path, Obj]) -> None:
    _, doc = item
    assert schema_errors(doc) == []


@pytest.mark.parametrize("item", DOCUMENTS, ids=_doc_id)
def test_every_object_names_its_namespace_exactly_when_it_is_namespaced(item: tuple[Path, Obj]) -> None:
    # No kustomize `namespace:` transformer (it would move the kube-system RoleBinding), so each
    # namespaced object must say where it goes, and a cluster-scoped one must not pretend to.
    _, doc = item
    namespace = doc.get("metadata", {}).get("namespace")
    if resource_for(doc).namespaced:
        assert namespace, f"{doc['kind']} {doc['metadata']['name']} is namespaced but names no namespace"
    else:
        assert namespace is None, f"{doc['kind']} {doc['metadata']['name']} is cluster-scoped"


def _deployment_doc() -> Obj:
    return copy.deepcopy(find([d for _, d in DOCUMENTS], "Deployment", "aggregator", NAMESPACE))


def test_the_schema_check_rejects_what_kube_apiserver_would() -> None:
    # The checks above must be able to fail: a typo, a wrong type, a missing required field and
    # an API version Kubernetes no longer serves are each caught.
    typo = _deployment_doc()
    typo["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {"runAsNonRoot": True}
    assert schema_errors(typo) == ["unknown field 'spec.template.spec.containers[0].securityContex'"]

    wrong_type = _deployment_doc()
    wrong_type["spec"]["replicas"] = "2"
    assert any("replicas" in e for e in schema_errors(wrong_type))

    missing = _deployment_doc()
    del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    assert any("name" in e for e in schema_errors(missing))

    gone = {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"}}
    with pytest.raises(AssertionError, match="serves no resource 'poddisruptionbudgets'"):
        resource_for(gone)


# --- kubectl -----------------------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize(
    "directory", kustomization_dirs(), ids=lambda d: str(d.relative_to(MANIFESTS)) or "."
)
def test_kustomize_builds(directory: Path) -> None:
    objs = kustomize(directory)
    assert objs
    for obj in objs:
        assert schema_errors(obj) == [], f"{directory}: {obj['kind']} {obj['metadata']['name']}"


@needs_kubectl
def test_the_top_level_kustomization_is_the_base() -> None:
    assert kustomize(MANIFESTS) == kustomize(MANIFESTS / "base")


@needs_kubectl
def test_both_optional_components_combine_in_one_kustomization(tmp_path: Path) -> None:
    # Operators who want both features list both components next to the base.
    def rel(path: str) -> str:  # kustomize wants relative paths
        return os.path.relpath(MANIFESTS / path, tmp_path)

    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel('base')}\n"
        "components:\n"
        f"  - {rel('overlays/components/write-apiservice-status')}\n"
        f"  - {rel('overlays/components/impersonate')}\n"
    )
    objs = kustomize(tmp_path)
    args = find(objs, "Deployment", "aggregator", NAMESPACE)["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--write-apiservice-status" in args
    assert "--delegate-auth=impersonate" in args
    find(objs, "ClusterRole", "aggregator:apiservice-status-writer")
    find(objs, "ClusterRole", "aggregator:impersonator")


def _assert_dry_run_created(result: subprocess.CompletedProcess[str], objs: list[Obj]) -> None:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(objs), result.stdout
    assert all(line.endswith(" created (dry run)") for line in lines), result.stdout
    for obj in objs:
        name = obj["metadata"]["name"]
        assert any(line.split(" ")[0].endswith(f"/{name}") for line in lines), (name, result.stdout)


@needs_kubectl
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_kubectl_apply_client_dry_run_accepts_each_file(path: Path, discovery: Any) -> None:
    server, kubeconfig = discovery
    result = kubectl_apply_dry_run(kubeconfig, "-f", str(path))
    _assert_dry_run_created(result, load_documents(path.read_text()))
    assert not [r for r in server.requests if not r.startswith("GET ")], "a client dry run wrote"


@needs_kubectl
@pytest.mark.parametrize(
    "directory", kustomization_dirs(), ids=lambda d: str(d.relative_to(MANIFESTS)) or "."
)
def test_kubectl_apply_client_dry_run_accepts_each_kustomization(directory: Path, discovery: Any) -> None:
    server, kubeconfig = discovery
    result = kubectl_apply_dry_run(kubeconfig, "-k", str(directory))
    _assert_dry_run_created(result, kustomize(directory))
    assert not [r for r in server.requests if not r.startswith("GET ")], "a client dry run wrote"


@needs_kubectl
def test_kubectl_dry_run_rejects_a_kind_the_cluster_does_not_serve(tmp_path: Path, discovery: Any) -> None:
    _, kubeconfig = discovery
    bogus = tmp_path / "bogus.yaml"
    bogus.write_text("apiVersion: apps/v1\nkind: Deploymnet\nmetadata:\n  name: x\n  namespace: demo\n")
    result = kubectl_apply_dry_run(kubeconfig, "-f", str(bogus))
    assert result.returncode != 0
    assert 'no matches for kind "Deploymnet"' in result.stderr


# --- RBAC objects: no wildcards anywhere --------------------------------------------------------------


def _rules(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", rule)
        for o in objs
        if o["kind"] in RBAC_ROLE_KINDS
        for rule in o.get("rules", [])
    ]


def test_no_role_anywhere_grants_a_wildcard() -> None:
    rules = _rules([d for _, d in DOCUMENTS])
    assert rules
    for where, rule in rules:
        for key in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
            for value in rule.get(key, []):
                assert "*" not in value, f"{where}: {key} contains {value!r}"


def test_the_base_grants_no_write_and_no_impersonation() -> None:
    base = [d for path, d in DOCUMENTS if path.parent.name == "base"]
    for where, rule in _rules(base):
        assert set(rule["verbs"]) <= {"get", "list", "watch", "create"}, where
        if "create" in rule["verbs"]:
            # The only creates are the non-mutating reviews.
            assert set(rule["resources"]) <= {"tokenreviews", "subjectaccessreviews"}, where


# --- the Deployment ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_objects() -> list[Obj]:
    return [d for path, d in DOCUMENTS if path.parent.name == "base"]


@pytest.fixture(scope="module")
def deployment(base_objects: list[Obj]) -> Obj:
    return find(base_objects, "Deployment", "aggregator", NAMESPACE)


def _container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_two_replicas_spread_over_nodes_and_never_both_down(deployment: Obj) -> None:
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"] == GATEWAY_LABELS
    assert GATEWAY_LABELS.items() <= pod_labels.items()
    by_key = {c["topologyKey"]: c for c in spec["template"]["spec"]["topologySpreadConstraints"]}
    per_node = by_key["kubernetes.io/hostname"]
    assert per_node["maxSkew"] == 1
    assert per_node["whenUnsatisfiable"] == "DoNotSchedule"
    assert per_node["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    assert by_key["topology.kubernetes.io/zone"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()


def test_the_pod_is_locked_down(deployment: Obj) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "aggregator"
    assert pod["automountServiceAccountToken"] is True  # in-cluster credentials
    pod_sc = pod["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] != 0 and pod_sc["runAsGroup"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    sc = _container(deployment)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_resources_have_requests_and_limits(deployment: Obj) -> None:
    resources = _container(deployment)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) >= {"memory"}


def test_probes_hit_the_health_paths_over_https_on_the_serving_port(deployment: Obj) -> None:
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 8443}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get["scheme"] == "HTTPS"
        assert ports.get(get["port"], get["port"]) == 8443


def _serve_options(args: list[str]) -> Options:
    parsed = build_parser().parse_args(["serve", *args])
    return options_from_args(parsed)


def test_every_flag_in_the_deployment_exists_in_serve_help(deployment: Obj) -> None:
    args = _container(deployment)["args"]
    help_text = subprocess.run(
        [sys.executable, "-m", "aggregator", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for arg in args:
        flag = arg.split("=", 1)[0]
        assert flag.startswith("--"), f"{arg!r}: use --flag=value so each arg is one flag"
        assert flag in help_text, f"{flag} is not a flag of `aggregator serve`"
    _serve_options(args)  # and the values parse (argparse exits on a bad one)


def test_the_deployment_runs_kube_mode_in_cluster_with_mounted_certificates(deployment: Obj) -> None:
    container = _container(deployment)
    options = _serve_options(container["args"])
    assert options.source.kube_mode and options.source.kubeconfig is None  # in-cluster credentials
    assert options.logging.format == "json"
    assert options.serving.port == 8443
    assert options.delegation.delegate_auth == "front-proxy" and not options.availability.write_apiservice_status
    # Client CA and front-proxy settings come from extension-apiserver-authentication.
    assert options.authentication.client_ca_file is None and options.authentication.requestheader.client_ca_file is None

    pod = deployment["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    files = {
        "serving": (options.serving.cert_file, options.serving.key_file),
        "front-proxy": (options.backends.proxy_client_cert_file, options.backends.proxy_client_key_file),
    }
    expected_secret = {"serving": "aggregator-serving-cert", "front-proxy": "aggregator-front-proxy-client"}
    for purpose, (cert, key) in files.items():
        assert cert and key
        cert_dir, key_dir = str(Path(cert).parent), str(Path(key).parent)
        assert cert_dir == key_dir, purpose
        mount = mounts[cert_dir]
        assert mount["readOnly"] is True
        assert secrets[mount["name"]] == expected_secret[purpose]
        # kubernetes.io/tls Secrets hold tls.crt and tls.key.
        assert (Path(cert).name, Path(key).name) == ("tls.crt", "tls.key")
    # The only writable mount is a small in-memory /tmp.
    writable = [m for m in container["volumeMounts"] if not m.get("readOnly")]
    assert [m["mountPath"] for m in writable] == ["/tmp"]


async def test_the_probe_paths_answer_the_kubelet_without_credentials(
    deployment: Obj, start_gateway: StartGateway, pki: PKI
) -> None:
    # The kubelet presents no client certificate and no token: the probes must still get 200.
    server = await start_gateway()
    context = ssl.create_default_context(cafile=str(pki.path("ca.crt")))
    container = _container(deployment)
    async with aiohttp.ClientSession() as session:
        for probe in ("readinessProbe", "livenessProbe"):
            path = container[probe]["httpGet"]["path"]
            async with session.get(f"{server.url}{path}", ssl=context) as response:
                assert (response.status, await response.text()) == (200, "ok"), path
        # ... while other paths still demand credentials.
        async with session.get(f"{server.url}/metrics", ssl=context) as response:
            assert response.status == 401


def test_service_and_pdb_select_the_gateway_pods(base_objects: list[Obj], deployment: Obj) -> None:
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = find(base_objects, "Service", "aggregator", NAMESPACE)
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    pdb = find(base_objects, "PodDisruptionBudget", "aggregator", NAMESPACE)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_service_account_token_is_mounted_only_where_asked(base_objects: list[Obj]) -> None:
    account = find(base_objects, "ServiceAccount", "aggregator", NAMESPACE)
    assert account["automountServiceAccountToken"] is False
    namespace = find(base_objects, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@needs_kubectl
@pytest.mark.parametrize(
    ("overlay", "flag"),
    [
        ("write-apiservice-status", "--write-apiservice-status"),
        ("impersonate", "--delegate-auth=impersonate"),
    ],
)
def test_each_overlay_adds_its_flag_to_the_base(overlay: str, flag: str) -> None:
    base = kustomize(MANIFESTS / "base")
    objs = kustomize(MANIFESTS / "overlays" / overlay)
    args = _container(find(objs, "Deployment", "aggregator", NAMESPACE))["args"]
    base_args = _container(find(base, "Deployment", "aggregator", NAMESPACE))["args"]
    assert args == [*base_args, flag]
    options = _serve_options(args)
    assert options.availability.write_apiservice_status == (overlay == "write-apiservice-status")
    assert options.delegation.delegate_auth == ("impersonate" if overlay == "impersonate" else "front-proxy")
    # Everything in the base is still there, unchanged apart from the Deployment.
    base_names = set(describe(base))
    assert base_names <= set(describe(objs))


def test_a_graceful_shutdown_fits_in_the_termination_grace_period(deployment: Obj) -> None:
    """The kubelet sends SIGKILL after terminationGracePeriodSeconds: the whole shutdown sequence
    (delay, drain, close) must end before it, with room for stopping the components."""
    options = _serve_options(_container(deployment)["args"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert options.server.shutdown_delay_duration > 0  # endpoints drop the pod before it stops listening
    assert shutdown_bound(complete(options).shutdown) + 5 <= grace
