"""The gateway's registry: runtime collectors, build info, certificate expiry, one APIService label."""

from __future__ import annotations

import aiohttp
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.tls.issue import new_ca
from aggregator.web.certexpiry import CLIENT_CA, SERVING
from aggregator.web.metrics import Metrics
from tests.conftest import StartGateway
from tests.support.pki import PKI

# kubernetes_build_info's labels (k8s.io/component-base/metrics/version.go).
BUILD_INFO_LABELS = {
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
}
# Upstream-named metrics keep upstream's `name` label; everything else says `apiservice`. (The
# leader-election pair's `name` is the Lease's, as in client-go.)
UPSTREAM_NAME_LABELLED = {
    "aggregator_unavailable_apiservice",
    "aggregator_unavailable_apiservice_total",
    "leader_election_master_status",
    "leader_election_slowpath_total",
}


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_process_and_python_collectors_are_in_each_gateways_registry() -> None:
    one, two = Metrics(), Metrics()  # no process-global registration: two gateways coexist
    for metrics in (one, two):
        exposed = families(generate_latest(metrics.registry).decode())
        for name in (
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
            "python_info",
            "python_gc_collections",
        ):
            assert exposed.get(name), name


def test_build_info_has_kubernetes_build_infos_labels_and_value_one() -> None:
    exposed = families(generate_latest(Metrics().registry).decode())
    ((labels, value),) = exposed["aggregator_build_info"]
    assert set(labels) == BUILD_INFO_LABELS
    assert value == 1
    assert labels["git_version"].startswith("v") and labels["go_version"].startswith("python3.")


def test_the_apiserver_request_metrics_are_in_a_gateways_registry() -> None:
    text = generate_latest(GatewayMetrics.declare().registry).decode()
    for name in (
        "apiserver_request_total",
        "apiserver_request_duration_seconds",
        "apiserver_current_inflight_requests",
        "apiserver_longrunning_requests",
        "apiserver_response_sizes",
        "apiserver_request_terminations_total",
    ):
        assert f"# TYPE {name} " in text, name


def _metric_objects(registry: CollectorRegistry) -> list[MetricWrapperBase]:
    """The standard metrics every feature declared on the registry."""
    return [c for c in registry._collector_to_names if isinstance(c, MetricWrapperBase)]


def test_one_label_name_for_the_apiservice() -> None:
    metrics = GatewayMetrics.declare()  # every feature's declarations, as a gateway process has them
    names = {}
    for metric in _metric_objects(metrics.registry):
        (family,) = metric.describe()
        names[family.name + ("_total" if family.type == "counter" else "")] = set(metric._labelnames)
    names["aggregator_unavailable_apiservice"] = {"name"}  # the custom collector
    assert {n for n, labels in names.items() if "name" in labels} == UPSTREAM_NAME_LABELLED
    assert {n for n, labels in names.items() if "apiservice" in labels} >= {
        "aggregator_insecure_backends",
        "aggregator_proxy_requests_total",
        "aggregator_backend_errors_total",
    }
    # The check sees the gateway's metrics at all (and so could fail).
    assert isinstance(metrics.backends.insecure, Gauge) and len(names) > 10


def test_certificate_expiry_is_exposed_by_the_registry() -> None:
    short, long = new_ca("old-ca", days=30), new_ca("new-ca", days=3650)
    metrics = Metrics()
    metrics.certificate_expiry.set_pem(CLIENT_CA, "/etc/ca/bundle.crt", short.cert_pem)
    metrics.certificate_expiry.set_pem(SERVING, "/etc/serving/tls.crt", long.cert_pem)
    exposed = families(generate_latest(metrics.registry).decode())[
        "aggregator_certificate_expiration_seconds"
    ]
    assert sorted((labels["certificate"], labels["source"], value) for labels, value in exposed) == [
        ("client-ca", "/etc/ca/bundle.crt", short.cert.not_valid_after_utc.timestamp()),
        ("serving", "/etc/serving/tls.crt", long.cert.not_valid_after_utc.timestamp()),
    ]


# --- end to end --------------------------------------------------------------------------------------


async def test_metrics_endpoint_shows_process_python_and_build_info(
    start_gateway: StartGateway, pki: PKI
) -> None:
    server = await start_gateway()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/metrics", ssl=pki.client_context()) as response:
            assert response.status == 200
            exposed = families(await response.text())
        async with session.get(f"{server.url}/version", ssl=pki.client_context()) as response:
            version = await response.json()
    assert exposed["process_start_time_seconds"][0][1] > 0
    assert exposed["python_info"]
    ((labels, value),) = exposed["aggregator_build_info"]
    assert value == 1
    # The same facts as /version, under kubernetes_build_info's label names.
    assert labels == {
        "major": version["major"],
        "minor": version["minor"],
        "git_version": version["gitVersion"],
        "git_commit": version["gitCommit"],
        "git_tree_state": version["gitTreeState"],
        "build_date": version["buildDate"],
        "go_version": version["goVersion"],
        "compiler": version["compiler"],
        "platform": version["platform"],
    }

