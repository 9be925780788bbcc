"""docs/deploy.md's decision table: each path is a command that builds and applies as written.

Every `kubectl apply -k` of the table is built with `kubectl kustomize` and run with `kubectl apply
--dry-run=client` against the discovery-only API server (tests/manifests/conftest.py), and what it
installs is what its row promises: the base talks to kube-apiserver with the front-proxy
certificate, the impersonate overlay with the gateway's own credentials, the monitoring overlay adds
the ServiceMonitor, the alerts and the dashboard. The guide's own kustomization combining the
components is run the same way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.k8s import KUBECTL, MANIFESTS, REPO, Obj, find, kubectl_apply_dry_run, kustomize

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

GUIDE = REPO / "docs" / "deploy.md"
NAMESPACE = "aggregator-system"


def decision_table() -> dict[str, str]:
    """The path each row of "Which path is yours" applies: {first words of the row: directory}."""
    section = GUIDE.read_text().split("## Which path is yours", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.search(r"`kubectl apply -k ([\w./-]+)`", line)
        if line.startswith("| ") and found:
            rows[line.split("|")[1].strip()] = found[1]
    return rows


def args_of(objs: list[Obj]) -> list[str]:
    deployment = find(objs, "Deployment", "aggregator", NAMESPACE)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def dry_run(kubeconfig: Path, directory: Path, objs: list[Obj]) -> None:
    done = kubectl_apply_dry_run(kubeconfig, "-k", str(directory))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(objs) and all(line.endswith(" created (dry run)") for line in lines), done.stdout


def test_the_table_has_the_three_paths() -> None:
    assert list(decision_table().values()) == [
        "manifests/",
        "manifests/overlays/impersonate",
        "manifests/overlays/monitoring",
    ]


def test_a_self_managed_cluster_gets_the_base(discovery: Any) -> None:
    (row,) = [path for words, path in decision_table().items() if "self-managed" in words]
    objs = kustomize(REPO / row)
    dry_run(discovery[1], REPO / row, objs)
    args = args_of(objs)
    assert "--proxy-client-cert-file=/var/run/aggregator/front-proxy-client/tls.crt" in args
    assert not [a for a in args if a.startswith("--delegate-auth")]  # front-proxy headers, the default
    assert not [o for o in objs if o["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")]
    rules = [r for o in objs if o["kind"] == "ClusterRole" for r in o.get("rules", [])]
    assert not [r for r in rules if "impersonate" in r.get("verbs", [])]


def test_a_managed_cluster_gets_the_impersonate_overlay(discovery: Any) -> None:
    (row,) = [path for words, path in decision_table().items() if "managed" in words and "self" not in words]
    objs = kustomize(REPO / row)
    dry_run(discovery[1], REPO / row, objs)
    assert "--delegate-auth=impersonate" in args_of(objs)
    rules = [r for o in objs if o["kind"] == "ClusterRole" for r in o.get("rules", [])]
    assert [r for r in rules if "impersonate" in r.get("verbs", [])]


def test_monitoring_gets_the_overlay_with_the_dashboard(discovery: Any) -> None:
    (row,) = [path for words, path in decision_table().items() if "Prometheus Operator" in words]
    objs = kustomize(REPO / row)
    dry_run(discovery[1], REPO / row, objs)
    find(objs, "ServiceMonitor", "aggregator", NAMESPACE)
    find(objs, "PrometheusRule", "aggregator", NAMESPACE)
    dashboard = find(objs, "ConfigMap", "aggregator-dashboard", NAMESPACE)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "aggregator.json" in dashboard["data"]


def test_the_guides_combined_kustomization_applies(tmp_path: Path, discovery: Any) -> None:
    block = re.search(r"<!-- tested: combined-kustomization -->\n```yaml\n(.*?)```", GUIDE.read_text(), re.S)
    assert block, "docs/deploy.md lost its combined kustomization"
    # kustomize wants relative paths: the guide's path/to/manifests, from a folder of one's own
    manifests = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block[1].replace("path/to/manifests", manifests))
    objs = kustomize(tmp_path)
    dry_run(discovery[1], tmp_path, objs)
    args = args_of(objs)
    assert "--write-apiservice-status" in args and "--delegate-auth=impersonate" in args
    find(objs, "ConfigMap", "aggregator-dashboard", NAMESPACE)
    assert {"ServiceMonitor", "PrometheusRule"} <= {o["kind"] for o in objs}
    find(objs, "Role", "aggregator:leader-election", NAMESPACE)
    assert yaml.safe_load(block[1])["components"][-1].endswith("overlays/components/monitoring")


def test_a_dry_run_refuses_what_a_cluster_would(tmp_path: Path, discovery: Any) -> None:
    """The dry run can fail: a kind the cluster does not serve stops the apply."""
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - extra.yaml\n"
    )
    (tmp_path / "extra.yaml").write_text("apiVersion: example.com/v1\nkind: Nothing\nmetadata:\n  name: x\n")
    done = kubectl_apply_dry_run(discovery[1], "-k", str(tmp_path))
    assert done.returncode != 0 and 'no matches for kind "Nothing"' in done.stderr, done.stderr
