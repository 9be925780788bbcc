"""manifests/overlays/monitoring: the opt-in ServiceMonitor and PrometheusRule.

They build with kubectl, scrape what the base serves, alert only on metrics the gateway really
exposes (PromQL metric names checked against a live `Metrics` registry), and say exactly what
docs/deploy.md suggests. Schemas and kubectl's dry run are covered for every manifest by
test_manifests.py (the Prometheus Operator's kinds through tests/manifests/k8s.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.sources.problems import ManifestReport
from tests.manifests.k8s import KUBECTL, MANIFESTS, REPO, Obj, find, kustomize, schema_errors

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

NAMESPACE = "aggregator-system"
COMPONENT = MANIFESTS / "overlays/components/monitoring"
GUIDE = REPO / "docs" / "deploy.md"


def _component_objects() -> list[Obj]:
    docs: list[Obj] = []
    for name in ("servicemonitor.yaml", "prometheusrule.yaml", "rbac.yaml"):
        docs.extend(d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d)
    return docs


def rules() -> list[Obj]:
    rule = find(_component_objects(), "PrometheusRule", "aggregator", NAMESPACE)
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


# --- PromQL: which metric names an expression reads --------------------------------------------------

_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
_WORDS |= {"offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, keywords, labels or numbers)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)  # label lists of by/without/on/ignoring/group_*
    names = set()
    for match in re.finditer(r"[A-Za-z0-9_:.]+", text):
        token = match[0]
        if token[0].isdigit() or token[0] == "." or token.lower() in _WORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function call
        names.add(token)
    return names


def gateway_registry() -> CollectorRegistry:
    """Every family a gateway can expose: every feature's (`GatewayMetrics`), and the folder's."""
    metrics = GatewayMetrics.declare()
    ManifestReport(list, metrics.registry)  # local mode's folder
    return metrics.registry


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can expose, including those with no sample yet."""
    names: set[str] = set()
    for family in registry.collect():
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def test_the_promql_reader_finds_metrics_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (apiservice, le) (rate(x_bucket{code=~"5..", a="b(c)"}[5m]))) > 1e3 '
        "and on (name) max without (kind) (y) unless z offset 5m or time() - w > 7 * 86400"
    )
    assert metric_names(expr) == {"x_bucket", "y", "z", "w"}


def test_every_alert_reads_only_metrics_the_gateway_exposes() -> None:
    exposed = exposed_names(gateway_registry())
    assert {"aggregator_backend_errors_total", "apiserver_request_duration_seconds_bucket"} <= exposed
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exposed, (
            f"{rule['alert']} reads {sorted(names - exposed)}, which the gateway does not expose"
        )


def test_the_exposure_check_can_fail() -> None:
    exposed = exposed_names(gateway_registry())
    # Upstream's names for things the gateway calls differently are not there.
    assert not metric_names("aggregator_unavailable_apiservice_count + apiserver_request_count") <= exposed


def test_the_alerts_are_the_ones_the_guide_suggests() -> None:
    match = re.search(r"Useful alerts[^\n]*:\n\n```text\n(.*?)```", GUIDE.read_text(), re.S)
    assert match, "docs/deploy.md lost its alert suggestions"
    suggested = []
    for line in match[1].splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        expr_for = re.fullmatch(r"(.*?)(?:\s{2,}for (\S+))?", line.strip())
        assert expr_for
        suggested.append((expr_for[1], expr_for[2]))
    assert [(r["expr"], r.get("for")) for r in rules()] == suggested


def test_every_alert_has_a_name_a_severity_and_a_summary() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(set(names)) == len(names)
    for rule in rules():
        assert rule["alert"].startswith("Aggregator"), rule
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


# --- the overlay -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def monitoring() -> list[Obj]:
    return kustomize(MANIFESTS / "overlays/monitoring")


@needs_kubectl
def test_the_overlay_is_the_base_plus_monitoring_and_the_base_has_none(monitoring: list[Obj]) -> None:
    base = kustomize(MANIFESTS / "base")
    assert [o for o in monitoring if o in base] == base
    added = sorted((o["kind"], o["metadata"]["name"]) for o in monitoring if o not in base)
    assert added == [
        ("ClusterRole", "aggregator:metrics-reader"),
        ("ClusterRoleBinding", "aggregator:metrics-reader"),
        ("ConfigMap", "aggregator-dashboard"),
        ("PrometheusRule", "aggregator"),
        ("ServiceMonitor", "aggregator"),
    ]
    for obj in monitoring:
        assert schema_errors(obj) == [], obj["kind"]


@needs_kubectl
def test_the_service_monitor_scrapes_each_gateway_pod_over_https(monitoring: list[Obj]) -> None:
    monitor = find(monitoring, "ServiceMonitor", "aggregator", NAMESPACE)["spec"]
    service = find(monitoring, "Service", "aggregator", NAMESPACE)
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    # The serving certificate names the Service (docs/deploy.md issues it so), not pod addresses.
    assert endpoint["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]
    ca = endpoint["tlsConfig"]["ca"]["configMap"]
    assert f"create configmap {ca['name']} --from-file={ca['key']}=" in GUIDE.read_text()


@needs_kubectl
def test_the_scraper_may_get_metrics_and_nothing_else(monitoring: list[Obj]) -> None:
    role = find(monitoring, "ClusterRole", "aggregator:metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = find(monitoring, "ClusterRoleBinding", "aggregator:metrics-reader")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["kind"] for s in binding["subjects"]] == ["ServiceAccount"]


def test_the_custom_schema_check_rejects_what_the_crd_would() -> None:
    monitor = find(_component_objects(), "ServiceMonitor", "aggregator", NAMESPACE)
    typo = yaml.safe_load(yaml.safe_dump(monitor))
    typo["spec"]["endpoints"][0]["tlsConfg"] = {}
    assert schema_errors(typo) == ["unknown field 'spec.endpoints[0].tlsConfg'"]
    wrong = yaml.safe_load(yaml.safe_dump(monitor))
    wrong["spec"]["endpoints"][0]["scheme"] = "HTTPS"
    wrong["spec"]["endpoints"][0]["interval"] = "30 seconds"
    del wrong["spec"]["selector"]
    assert len(schema_errors(wrong)) == 3
    rule = find(_component_objects(), "PrometheusRule", "aggregator", NAMESPACE)
    no_expr = yaml.safe_load(yaml.safe_dump(rule))
    del no_expr["spec"]["groups"][0]["rules"][0]["expr"]
    assert schema_errors(no_expr) == ["spec.groups[0].rules[0].expr: required"]


def test_the_guide_names_the_overlay() -> None:
    assert "manifests/overlays/monitoring" in GUIDE.read_text()
    assert Path(MANIFESTS / "overlays/monitoring/kustomization.yaml").exists()
