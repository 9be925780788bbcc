"""The Grafana dashboard: read as Grafana reads an imported file, shipped for the sidecar, and every
query proven against a real Prometheus scraping a running gateway.

The live test is the shipped configuration: kube mode against the fake kube-apiserver, `--workers
2`, the sample extension server behind one APIService pair and a dead backend behind another;
Prometheus scrapes `/metrics` over TLS with a client certificate that the gateway authorizes with a
SubjectAccessReview (the fake allows that user `get` on `/metrics` and nothing else). Under traffic
to both, every target of every panel is interpolated as Grafana interpolates it and evaluated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from aggregator.availability.quarantine import QuarantineMetrics
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.web.metrics import Metrics
from aggregator.workers.metrics import WorkerMetrics
from tests.manifests.k8s import KUBECTL, MANIFESTS, find, kustomize
from tests.manifests.test_monitoring import exposed_names, metric_names
from tests.support.fakereviews import Spec
from tests.support.kubestack import KubeStack
from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.support.ports import free_port
from tests.support.prometheus import (
    Prometheus,
    Scrape,
    interpolate,
    label_values_query,
    needs_prometheus,
    running_prometheus,
)
from tests.workers.group import running_serve

pytestmark = pytest.mark.long(15)

DASHBOARD = MANIFESTS / "overlays/components/monitoring/aggregator-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "state-timeline", "bargauge"}
GRID_WIDTH = 24
# Grafana's $__rate_interval for a data source scraped every second: max($__interval + 1s, 4 x 1s).
SCRAPE_INTERVAL = "1s"
RATE_INTERVAL = "5s"
# Targets that may rightly be empty in the live test, and why.
MAY_BE_EMPTY = {
    # Nothing overloads the gateway in this test: no request is refused past max-in-flight.
    ("In flight, and refused with 429", "refused with 429 per second"),
    # No APIService here has an aggregator.dev/max-concurrent-requests annotation.
    ("Refused at max-concurrent-requests", "{{apiservice}}"),
    # Nothing overloads a priority level either.
    ("Dispatched and refused by priority level", "refused {{priority_level}}: {{reason}}"),
}

JSON = dict[str, Any]


def dashboard() -> JSON:
    data: JSON = json.loads(DASHBOARD.read_text())
    return data


def all_panels(board: JSON) -> Iterator[JSON]:
    """Every panel, those inside collapsed rows too."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def graph_panels(board: JSON) -> list[JSON]:
    return [p for p in all_panels(board) if p["type"] != "row"]


def targets(board: JSON) -> list[tuple[str, str, str]]:
    """(panel title, legend, expr) of every query the panels run."""
    return [(p["title"], t["legendFormat"], t["expr"]) for p in graph_panels(board) for t in p["targets"]]


def variables(board: JSON) -> dict[str, JSON]:
    return {v["name"]: v for v in board["templating"]["list"]}


def variable_query(variable: JSON) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


# --- as Grafana reads the file ------------------------------------------------------------------------------


def test_the_file_is_an_importable_dashboard() -> None:
    board = dashboard()
    assert board["title"] == "Kubernetes / Aggregation gateway"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"]), board["uid"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    # Imported as a new dashboard: no numeric id; no __inputs, which the sidecar would not resolve.
    assert "id" not in board and "__inputs" not in board and "__requires" not in board
    assert board["time"] == {"from": "now-1h", "to": "now"} and board["editable"] is True
    assert "aggregator" in board["tags"]


def test_a_datasource_variable_and_an_apiservice_variable_drive_every_query() -> None:
    board = dashboard()
    found = variables(board)
    assert list(found) == ["datasource", "cluster", "job", "instance", "apiservice"]
    datasource = found["datasource"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    assert found["cluster"]["hide"] == 2  # kubernetes-mixin's convention: shown only for several clusters
    apiservice = found["apiservice"]
    assert apiservice["includeAll"] and apiservice["multi"] and apiservice["allValue"] == ".*"
    for variable in list(found.values())[1:]:
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE
        assert label_values_query(variable_query(variable)) is not None
    for title, _legend, expr in targets(board):
        assert 'cluster="$cluster", job="$job", instance=~"$instance"' in expr, title


def test_every_variable_a_query_names_is_defined() -> None:
    board = dashboard()
    defined = {name: ".*" for name in variables(board)}
    texts = [expr for _, _, expr in targets(board)] + [variable_query(v) for v in variables(board).values()]
    for text in texts:
        left = interpolate(text, defined, RATE_INTERVAL)  # a KeyError names an undefined variable
        assert "$" not in left, text


def test_panels_sit_on_the_grid_without_overlapping() -> None:
    board = dashboard()
    panels = list(all_panels(board))
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids) and all(isinstance(i, int) for i in ids)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        if panel["type"] == "row":
            assert (pos["h"], pos["w"], pos["x"]) == (1, GRID_WIDTH, 0)
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_panel_queries_the_chosen_prometheus() -> None:
    for panel in graph_panels(dashboard()):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]


def test_the_panels_cover_what_an_operator_watches() -> None:
    titles = {p["title"] for p in graph_panels(dashboard())}
    assert {
        "Unavailable APIServices",
        "Availability by APIService",
        "Became unavailable, by reason",
        "Proxied requests by code",
        "Backend errors by kind",
        "Time to response headers, p50 and p99",
        "Seconds since the last good discovery fetch",
        "Certificates: time to expiry",
        "Workers and restarts",
        "In flight, and refused with 429",
        "Requests per endpoint",
        "Endpoint failures and retries",
        "Ejected endpoints",
        "Backend phases, p99",
        "Quarantined from discovery",
        "Dispatched and refused by priority level",
        "Waiting in queue and executing, by priority level",
        "Time waiting in queue, p99",
        "Seats in use, and each level's limit",
    } <= titles


def test_every_metric_the_dashboard_reads_is_one_the_gateway_exposes() -> None:
    # declared by the features, beside the gateway's registry
    quarantine, apf = CollectorRegistry(), CollectorRegistry()
    QuarantineMetrics(quarantine)
    FlowControlMetrics(apf)
    exposed = (
        exposed_names(Metrics().registry)
        | exposed_names(WorkerMetrics(2).registry)
        | exposed_names(quarantine)
        | exposed_names(apf)
    )
    board = dashboard()
    for title, _legend, expr in targets(board):
        assert metric_names(expr) <= exposed, (title, metric_names(expr) - exposed)
    for variable in list(variables(board).values())[1:]:
        query = label_values_query(variable_query(variable))
        assert query is not None and metric_names(query[0]) <= exposed


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
def test_the_monitoring_overlay_ships_it_for_the_grafana_sidecar() -> None:
    objs = kustomize(MANIFESTS / "overlays/monitoring")
    config_map = find(objs, "ConfigMap", "aggregator-dashboard", "aggregator-system")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["aggregator.json"]) == dashboard()


# --- against a real Prometheus ---------------------------------------------------------------------------

DEAD_APISERVICE = "v1.dead.example.com"
HEALTHY_APISERVICE = "v1beta1.wardle.example.com"
SCRAPER = "prometheus"


def scraper_may_read_metrics_only(spec: Spec) -> dict[str, Any]:
    """The fake's SubjectAccessReviews: the scraper may `get` `/metrics` and nothing else."""
    if spec.get("user") != SCRAPER:
        return {"allowed": True}
    attrs = spec.get("nonResourceAttributes") or {}
    return {"allowed": attrs.get("path") == "/metrics" and attrs.get("verb") == "get"}


def dead_backend(port: int) -> list[JSON]:
    """An APIService whose Service has a ready endpoint where nothing listens: a backend that died
    since kube-apiserver's aggregator last wrote its status (still Available, as stored). It
    stores nothing, so it is quarantined from discovery after a second unavailable."""
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": DEAD_APISERVICE, "annotations": {"aggregator.dev/discovery-quarantine-after": "1s"}},
            "spec": {
                "group": "dead.example.com",
                "version": "v1",
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
                "service": {"namespace": "dead", "name": "api", "port": port},
            },
            "status": {
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "reason": "Passed",
                        "message": "all checks passed",
                    }
                ]
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": "dead", "name": "api"},
            "spec": {"clusterIP": "127.0.0.1", "ports": [{"name": "https", "port": port, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"namespace": "dead", "name": "api-1", "labels": {"kubernetes.io/service-name": "api"}},
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        },
    ]


def kube_mode_args(stack: KubeStack, pki: PKI, port: int) -> list[str]:
    kube = stack.kube
    assert kube.kubeconfig is not None
    cert, key = kube.issue_front_proxy_cert()  # signed by the cluster's front-proxy CA, which wardle trusts
    return [
        *(sys.executable, "-m", "aggregator", "serve"),
        *("--kubeconfig", str(kube.kubeconfig), "--workers", "2"),
        *("--bind-address", "127.0.0.1", "--secure-port", str(port)),
        *("--tls-cert-file", pki.path("serving.crt"), "--tls-private-key-file", pki.path("serving.key")),
        *("--client-ca-file", pki.path("client-ca.crt")),
        *("--requestheader-client-ca-file", pki.path("front-proxy-ca.crt")),
        *("--requestheader-allowed-names", "front-proxy-client"),
        *("--proxy-client-cert-file", str(cert), "--proxy-client-key-file", str(key)),
        "--authentication-skip-lookup",  # the fake publishes no extension-apiserver-authentication
        "--backend-deny-cidrs=169.254.0.0/16,fe80::/10",  # the fake cluster's backends are on loopback
        "--enable-aggregator-routing",  # balanced over the endpoints: the endpoint panels have data
    ]


def with_a_dead_replica(stack: KubeStack) -> str:
    """The sample server's EndpointSlice lists a second ready endpoint where nothing listens: a
    replica that died. Returns it (`ip:port`)."""
    kube = stack.kube
    slices = kube.objects["endpointslices"]
    key = next(k for k, obj in slices.items() if obj["metadata"]["name"].endswith("-local"))
    eps = dict(slices[key])
    eps["endpoints"] = [*eps["endpoints"], {"addresses": ["127.0.0.2"], "conditions": {"ready": True}}]
    kube.update_object("endpointslices", eps)
    return f"127.0.0.2:{eps['ports'][0]['port']}"


@contextlib.asynccontextmanager
async def traffic(url: str, pki: PKI) -> AsyncIterator[dict[str, int]]:
    """Requests to the healthy and the dead APIService, on fresh connections (so both workers
    answer), until the block ends; yields the count of answers by status."""
    seen: dict[str, int] = {}
    stop = asyncio.Event()

    async def drive() -> None:
        context = pki.client_context()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            while not stop.is_set():
                for path in (
                    "/apis/wardle.example.com/v1beta1/namespaces/default/flunders",
                    "/apis/wardle.example.com/v1alpha1/fischers",
                    "/apis/dead.example.com/v1/widgets",
                    "/apis",
                ):
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        async with session.get(url + path, ssl=context) as resp:
                            await resp.read()
                            seen[str(resp.status)] = seen.get(str(resp.status), 0) + 1
                await asyncio.sleep(0.05)  # steady traffic for the rates, not a flood

    task = asyncio.create_task(drive())
    try:
        yield seen
    finally:
        stop.set()
        await task


async def evaluate(prom: Prometheus, values: dict[str, str | list[str]]) -> dict[tuple[str, str], list[JSON]]:
    """Every target's result, interpolated as Grafana would with `values`."""
    results = {}
    for title, legend, expr in targets(dashboard()):
        results[(title, legend)] = await prom.query(interpolate(expr, values, RATE_INTERVAL))
    return results


async def until_true(check: Any, timeout: float, what: str | Callable[[], str]) -> None:
    """Prometheus scrapes and evaluates at its own pace: asked every half second."""
    await until_async(check, timeout, what, every=0.5)


@needs_prometheus
async def test_every_query_evaluates_against_prometheus_scraping_a_gateway(pki: PKI, tmp_path: Path) -> None:
    scraper = pki.issue_user("prometheus-scraper", SCRAPER)
    port = free_port()
    async with KubeStack(pki, tmp_path, policy=scraper_may_read_metrics_only) as stack:
        resources = {"APIService": "apiservices", "Service": "services", "EndpointSlice": "endpointslices"}
        for doc in dead_backend(free_port()):
            stack.kube.add_object(resources[doc["kind"]], doc)
        dead_replica = with_a_dead_replica(stack)
        args = kube_mode_args(stack, pki, port)
        async with (
            running_serve(pki, args, port, tmp_path / "gateway.log") as gateway,
            running_prometheus(
                tmp_path / "prometheus",
                Scrape(
                    f"127.0.0.1:{port}",
                    ca_file=pki.path("ca.crt"),
                    cert_file=pki.path(f"{scraper}.crt"),
                    key_file=pki.path(f"{scraper}.key"),
                    interval=SCRAPE_INTERVAL,
                ),
            ) as prom,
            traffic(gateway.url, pki) as answers,
        ):
            # The scraper is authorized for /metrics and for nothing else.
            status, _ = await gateway.get("/apis", cert=scraper)
            assert status == 403

            await until_true(prom.targets_up, 30, "the scrape to succeed")
            board = dashboard()
            values: dict[str, str | list[str]] = {}
            offered: dict[str, list[str]] = {}

            async def variables_offer_values() -> bool:
                for name, variable in list(variables(board).items())[1:]:
                    query = label_values_query(interpolate(variable_query(variable), values, RATE_INTERVAL))
                    assert query is not None
                    offered[name] = await prom.label_values(query[1], query[0])
                    # A single-value variable takes the first value (none: empty); "All" is allValue.
                    values[name] = variable.get("allValue", ".*") if variable["includeAll"] else (
                        offered[name][0] if offered[name] else ""
                    )
                return DEAD_APISERVICE in offered["apiservice"] and HEALTHY_APISERVICE in offered["apiservice"]

            await until_true(variables_offer_values, 30, "the variables to offer values")
            assert offered["cluster"] == [] and offered["job"] == ["aggregator"]
            assert offered["instance"] == [f"127.0.0.1:{port}"]

            results: dict[tuple[str, str], list[JSON]] = {}

            async def almost_all_return_data() -> bool:
                nonlocal results
                results = await evaluate(prom, values)  # a QueryError fails the test at once
                return {key for key, result in results.items() if not result} <= MAY_BE_EMPTY

            await until_true(
                almost_all_return_data,
                60,
                lambda: f"every panel to have data; empty: {sorted(k for k, r in results.items() if not r)}",
            )
            assert answers.get("200") and answers.get("503"), answers
            empty = {key for key, result in results.items() if not result}
            assert len(results) == len(targets(board)) and len(empty) <= 0.1 * len(results), empty

            # What the panels say is what happened.
            unavailable = results[("Availability by APIService", "{{name}}")]
            states = {r["metric"]["name"]: r["value"][1] for r in unavailable}
            assert states[DEAD_APISERVICE] == "1" and states[HEALTHY_APISERVICE] == "0"
            assert results[("Unavailable APIServices", "unavailable")][0]["value"][1] == "1"
            reasons = {r["metric"]["reason"] for r in results[("Became unavailable, by reason", "{{name}}: {{reason}}")]}
            assert "FailedDiscoveryCheck" in reasons
            # The dead replica behind the healthy APIService: ejected, the request it failed retried.
            ejected = results[("Ejected endpoints", "ejected {{endpoint}}")]
            assert {r["metric"]["endpoint"] for r in ejected if r["value"][1] != "0"} == {dead_replica}
            retried = results[("Endpoint failures and retries", "retried after {{endpoint}}: {{reason}}")]
            assert {r["metric"]["endpoint"] for r in retried} == {dead_replica}
            # The dead APIService is out of discovery (still answering 503, above); the healthy one,
            # without the annotation, has no series.
            quarantined = results[("Quarantined from discovery", "{{apiservice}}")]
            assert {r["metric"]["apiservice"]: r["value"][1] for r in quarantined} == {DEAD_APISERVICE: "1"}
            workers = results[("Workers and restarts", "workers {{instance}}")]
            assert [r["value"][1] for r in workers] == ["2"]
            # APF: the admin's requests (system:masters) ran in the exempt level, with the cluster's limits
            dispatched = results[("Dispatched and refused by priority level", "dispatched {{priority_level}}")]
            assert "exempt" in {r["metric"]["priority_level"] for r in dispatched}
            limits = results[("Seats in use, and each level's limit", "limit {{priority_level}}")]
            assert {r["metric"]["priority_level"] for r in limits} >= {"global-default", "workload-low", "exempt"}

            # The APIService variable filters: the dead one only ever answered 503, the healthy one 200.
            for chosen, codes in ((DEAD_APISERVICE, {"503"}), (HEALTHY_APISERVICE, {"200"})):
                only = await evaluate(prom, {**values, "apiservice": [chosen]})
                by_code = only[("Proxied requests by code", "{{code}}")]
                assert {r["metric"]["code"] for r in by_code} == codes, chosen
