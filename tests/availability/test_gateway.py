"""A running local-mode gateway with real TLS backends: what callers, probes and Prometheus see.

One backend goes down: its group-version answers 503 `service unavailable`, the others keep
working, `/readyz` stays 200 (verbose lists the unavailable APIService), the gauge is 1 for that
APIService only, its discovery goes Stale, and its condition says which hop failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from aggregator.assembly import build_gateway
from aggregator.availability.checker import AvailabilityChecker
from aggregator.config import complete
from aggregator.model.apiservice import Condition
from aggregator.runners.server import GatewayServer
from aggregator.sources.store import MODIFIED, Kind
from tests.availability.conftest import StartBackend
from tests.support.backend import (
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.gateway import local_options
from tests.support.pki import PKI
from tests.support.polling import until, until_async

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass
class Registered:
    letter: str
    backend: FakeBackend

    @property
    def group(self) -> str:
        return f"{self.letter}.example.com"

    @property
    def name(self) -> str:
        return f"v1.{self.group}"

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/v1"


def resource_list(group: str) -> web.Response:
    return web.json_response(
        {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/v1",
            "resources": [
                {
                    "name": "things",
                    "singularName": "thing",
                    "namespaced": True,
                    "kind": "Thing",
                    "verbs": ["get"],
                }
            ],
        }
    )


def manifests(
    letter: str, port: int, ca_pem: bytes, *, service_port: int | None = None
) -> list[dict[str, Any]]:
    """APIService v1.<letter>.example.com -> Service demo/<letter> at 127.0.0.1:port, one EndpointSlice."""
    svc = apiservice_manifest(port=port, ca_pem=ca_pem, group=f"{letter}.example.com", service=letter)
    del svc["status"]
    return [
        svc,
        service_manifest(port=service_port or port, name=letter),
        endpointslice_manifest(f"{letter}-1", [("127.0.0.1", True)], port=port, service=letter),
    ]


def write(folder: Path, stem: str, docs: list[dict[str, Any]]) -> None:
    tmp = folder / f".{stem}.tmp"
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    tmp.rename(folder / f"{stem}.yaml")


@dataclass
class Running:
    server: GatewayServer
    pki: PKI
    session: aiohttp.ClientSession

    @property
    def checker(self) -> AvailabilityChecker:
        return self.server.gateway.control.availability

    def condition(self, name: str) -> Condition | None:
        svc = self.server.gateway.store.apiservice(name)
        return svc.condition() if svc is not None else None

    async def get(self, path: str, *, cert: str | None = "admin", **kwargs: Any) -> tuple[int, bytes, Any]:
        async with self.session.get(
            self.server.url + path, ssl=self.pki.client_context(cert), **kwargs
        ) as resp:
            return resp.status, await resp.read(), resp.headers


StartChecked = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_checked(pki: PKI, apiservices_dir: Path) -> AsyncIterator[StartChecked]:
    """A local-mode gateway whose checker runs on short, test-sized intervals."""
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())

        async def start(interval: float = 0.2, retry_initial: float = 0.05, **options: Any) -> Running:
            opts = local_options(pki, str(apiservices_dir), **options)
            config = complete(opts)
            gateway = build_gateway(config)
            checker = gateway.control.availability
            assert isinstance(checker, AvailabilityChecker)
            checker.interval, checker.retry_initial = interval, retry_initial
            checker.probe.timeout = 1.0
            server = GatewayServer(config, gateway)
            await server.start()
            stack.push_async_callback(server.stop)
            return Running(server, pki, session)

        yield start


async def start_pair(
    start_backend: StartBackend, backend_pki: BackendPKI, folder: Path
) -> tuple[Registered, Registered]:
    pair = []
    for letter in ("a", "b"):
        backend = await start_backend(hosts=[f"{letter}.demo.svc"])
        registered = Registered(letter, backend)

        async def discovery(_request: web.Request, group: str = registered.group) -> web.StreamResponse:
            return resource_list(group)

        backend.routes[registered.prefix] = discovery
        write(folder, letter, manifests(letter, backend.port, backend_pki.ca.cert_pem))
        pair.append(registered)
    return pair[0], pair[1]


def metric(text: str, family: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when the series is absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(family)}\{{{re.escape(wanted)}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def test_one_backend_down(
    start_checked: StartChecked, start_backend: StartBackend, backend_pki: BackendPKI, apiservices_dir: Path
) -> None:
    a, b = await start_pair(start_backend, backend_pki, apiservices_dir)
    running = await start_checked()
    checker = running.checker
    await until(lambda: checker.is_available(a.name) and checker.is_available(b.name))

    await b.backend.stop()
    await until(lambda: not checker.is_available(b.name))

    status, body, _ = await running.get(f"{b.prefix}/namespaces/default/things")
    assert status == 503
    assert json.loads(body)["message"] == "service unavailable"
    status, body, _ = await running.get(f"{a.prefix}/namespaces/default/things")
    assert status == 200 and json.loads(body)["user"] == "admin"

    status, body, _ = await running.get("/readyz")
    assert (status, body) == (200, b"ok")
    status, body, _ = await running.get("/readyz?verbose")
    text = body.decode()
    assert status == 200 and text.endswith("readyz check passed\n")
    url = f"https://127.0.0.1:{b.backend.port}{b.prefix}"
    assert (
        f"warn: APIService {b.name} is unavailable: FailedDiscoveryCheck: failing or missing response from {url}: "
    ) in text
    assert "hop: connect" in text and a.name not in text

    status, body, headers = await running.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    scraped = body.decode()
    assert metric(scraped, "aggregator_unavailable_apiservice", name=b.name) == 1.0
    assert metric(scraped, "aggregator_unavailable_apiservice", name=a.name) == 0.0
    assert (
        metric(scraped, "aggregator_unavailable_apiservice_total", name=b.name, reason="FailedDiscoveryCheck")
        == 1.0
    )
    assert f'aggregator_unavailable_apiservice_total{{name="{a.name}"' not in scraped
    assert (
        "# HELP aggregator_unavailable_apiservice [ALPHA] Gauge of APIServices which are marked as" in scraped
    )

    # kubectl get apiservices through the gateway shows the same condition
    status, body, _ = await running.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{b.name}")
    (condition,) = json.loads(body)["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "FailedDiscoveryCheck")
    assert condition["message"].startswith(f"failing or missing response from {url}: ")

    # discovery: the down group-version is Stale, the other Current
    async def freshness() -> dict[str, str]:
        _, body, _ = await running.get("/apis", headers={"Accept": AGGREGATED})
        items = json.loads(body)["items"]
        return {i["metadata"]["name"]: i["versions"][0]["freshness"] for i in items}

    seen: list[dict[str, str]] = []

    async def b_is(freshness_of_b: str) -> None:
        async def reached() -> bool:
            seen.append(await freshness())
            return seen[-1].get(b.group) == freshness_of_b

        await until_async(reached, 10, lambda: f"{b.group} {freshness_of_b}: {seen[-1]}")

    await b_is("Stale")
    assert seen[-1][a.group] == "Current"

    # back up: available again, the gauge back to 0, the counter still counts the one outage
    await b.backend.start()
    await until(lambda: checker.is_available(b.name))
    _, body, _ = await running.get("/metrics")
    scraped = body.decode()
    assert metric(scraped, "aggregator_unavailable_apiservice", name=b.name) == 0.0
    assert (
        metric(scraped, "aggregator_unavailable_apiservice_total", name=b.name, reason="FailedDiscoveryCheck")
        == 1.0
    )
    status, _, _ = await running.get(f"{b.prefix}/namespaces/default/things")
    assert status == 200
    await b_is("Current")


async def test_metrics_need_authentication(start_checked: StartChecked) -> None:
    running = await start_checked()
    status, _, _ = await running.get("/metrics", cert=None)
    assert status == 401


async def test_changes_are_checked_at_once_and_the_transition_time_moves_only_on_flips(
    start_checked: StartChecked, start_backend: StartBackend, backend_pki: BackendPKI, apiservices_dir: Path
) -> None:
    backend = await start_backend(hosts=["a.demo.svc"])
    # The Service does not listen on the APIService's port yet.
    write(apiservices_dir, "a", manifests("a", backend.port, backend_pki.ca.cert_pem, service_port=1))
    running = await start_checked(interval=3600.0)  # only changes can trigger a check now
    store = running.server.gateway.store
    await until(lambda: getattr(running.condition("v1.a.example.com"), "reason", "") == "ServicePortError")

    # An old transition time, as if it had been down since 2020 (a status-only write: no re-check).
    old = running.condition("v1.a.example.com")
    assert old is not None
    store.set_apiservice_conditions(
        "v1.a.example.com",
        (Condition("Available", "False", "2020-01-01T00:00:00Z", old.reason, old.message),),
    )
    checks = running.checker.checks

    # Still down, for another reason: reason and message change, the transition time does not.
    docs = manifests("a", backend.port, backend_pki.ca.cert_pem)
    write(apiservices_dir, "a", docs[:2])  # no EndpointSlice
    await until(lambda: getattr(running.condition("v1.a.example.com"), "reason", "") == "EndpointsNotFound")
    now = running.condition("v1.a.example.com")
    assert now is not None and now.last_transition_time == "2020-01-01T00:00:00Z"
    assert now.message == 'cannot find endpointslices for service/a in "demo" [hop: endpoints]'

    # Fixed: available at once, and the transition time moves.
    write(apiservices_dir, "a", docs)
    await until(lambda: getattr(running.condition("v1.a.example.com"), "status", "") == "True")
    fixed = running.condition("v1.a.example.com")
    assert fixed is not None and fixed.reason == "Passed" and fixed.message == "all checks passed"
    assert fixed.last_transition_time != "2020-01-01T00:00:00Z"
    assert running.checker.checks <= checks + 4  # event-driven, not polling


async def test_steady_state_writes_nothing(
    start_checked: StartChecked, start_backend: StartBackend, backend_pki: BackendPKI, apiservices_dir: Path
) -> None:
    a, b = await start_pair(start_backend, backend_pki, apiservices_dir)
    await b.backend.stop()
    running = await start_checked(interval=0.05, retry_initial=0.05)
    checker = running.checker
    await until(lambda: checker.verdict(a.name) is not None and checker.verdict(b.name) is not None)
    writes: list[str] = []
    running.server.gateway.store.add_listener(
        lambda e: writes.append(e.obj.name) if e.kind is Kind.APISERVICE and e.type == MODIFIED else None
    )
    checks = checker.checks
    await until(lambda: checker.checks >= checks + 10)
    assert writes == []


async def test_deleted_apiservice_loses_its_gauge(
    start_checked: StartChecked, start_backend: StartBackend, backend_pki: BackendPKI, apiservices_dir: Path
) -> None:
    a, b = await start_pair(start_backend, backend_pki, apiservices_dir)
    running = await start_checked()
    await until(lambda: running.checker.is_available(b.name))  # a first check timed out on a loaded machine is retried
    metrics = running.server.gateway.metrics.availability.unavailable
    assert metrics.value(b.name) == 0.0
    (apiservices_dir / "b.yaml").unlink()
    await until(lambda: metrics.value(b.name) is None)
    _, body, _ = await running.get("/metrics")
    assert f'aggregator_unavailable_apiservice{{name="{b.name}"}}' not in body.decode()
    assert metric(body.decode(), "aggregator_unavailable_apiservice", name=a.name) == 0.0
    assert running.checker.verdict(b.name) is None


def available_column(running: Running, name: str) -> str:
    """What `kubectl get apiservices` shows in AVAILABLE (local mode: the folder object's condition)."""
    condition = running.condition(name)
    return condition.status if condition is not None else "Unknown"


@pytest.mark.parametrize("request_kind", ["get", "exec"])
async def test_a_failed_request_flips_availability_within_a_second(
    start_checked: StartChecked,
    start_backend: StartBackend,
    backend_pki: BackendPKI,
    apiservices_dir: Path,
    request_kind: str,
) -> None:
    """No 30 s resync: a request that cannot connect has the APIService checked at once, and a
    request refused as unavailable has it checked again, so it comes back as soon as it is back."""
    a, b = await start_pair(start_backend, backend_pki, apiservices_dir)
    # Nothing but the proxy's suspicion may trigger a check in this test.
    running = await start_checked(interval=60.0, retry_initial=60.0)
    checker = running.checker
    await until(lambda: available_column(running, b.name) == "True" and checker.is_available(a.name))
    checks = checker.checks

    await b.backend.stop()
    path = f"{b.prefix}/namespaces/default/things"
    if request_kind == "get":
        status, body, _ = await running.get(path)
        assert status == 503
        assert json.loads(body)["message"].startswith("error trying to reach service: dial tcp 127.0.0.1:")
    else:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await running.session.ws_connect(
                running.server.url + path + "/t1/exec?command=sh",
                protocols=("v5.channel.k8s.io",),
                ssl=running.pki.client_context(),
            )
        assert refused.value.status == 503
    # the next scheduled check is a minute away: a flip within 30 s is the proxy's doing
    await until(lambda: available_column(running, b.name) == "False", timeout=30)
    assert not checker.is_available(b.name) and checker.is_available(a.name)
    assert checker.checks == checks + 1  # one check for b, none for a

    # Back up: the first client refused as unavailable has it checked again.
    await b.backend.start()
    status, body, _ = await running.get(path)
    assert (status, json.loads(body)["message"]) == (503, "service unavailable")
    await until(lambda: checker.is_available(b.name), timeout=30)
    status, _, _ = await running.get(path)
    assert status == 200
