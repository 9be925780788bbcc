"""kube-apiserver's request metrics for requests made through the running gateway, read from
/metrics as Prometheus scrapes them."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.discovery.fakes import AGG_TYPE
from tests.support.backend import GROUP, PREFIX, VERSION
from tests.support.fixtures import Proxied, StartProxied
from tests.support.polling import until

THINGS = f"{PREFIX}/namespaces/default/things"


async def scrape(proxied: Proxied, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    async with proxied.request("GET", "/metrics") as resp:
        text = await resp.text()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


async def test_a_list_through_the_gateway_is_counted_with_upstream_labels(
    start_proxied: StartProxied,
) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", THINGS) as resp:
        assert resp.status == 200
    async with proxied.request("GET", "/healthz") as resp:
        assert resp.status == 200
    counted = await scrape(proxied, "apiserver_request_total")
    listed = labels(
        verb="LIST",
        dry_run="",
        group=GROUP,
        version=VERSION,
        resource="things",
        subresource="",
        scope="namespace",
        component="aggregator",
        code="200",
    )
    assert counted[listed] == 1
    health = labels(
        verb="GET",
        dry_run="",
        group="",
        version="",
        resource="",
        subresource="/healthz",
        scope="",
        component="",
        code="200",
    )
    assert counted[health] == 1
    durations = await scrape(proxied, "apiserver_request_duration_seconds_count")
    assert durations[tuple(kv for kv in listed if kv[0] != "code")] == 1


async def test_a_refused_request_is_not_counted(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    async with proxied.request("GET", THINGS, cert=None) as resp:
        assert resp.status == 401
    assert [key for key in await scrape(proxied, "apiserver_request_total") if ("code", "401") in key] == []


async def test_a_watch_counts_as_long_running_while_it_runs(start_proxied: StartProxied) -> None:
    proxied = await start_proxied()
    release = asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await release.wait()
        await out.write_eof()
        return out

    proxied.backend.routes[THINGS] = watch
    gauge = labels(
        verb="WATCH",
        group=GROUP,
        version=VERSION,
        resource="things",
        subresource="",
        scope="namespace",
        component="aggregator",
    )
    async with proxied.request("GET", THINGS + "?watch=1") as resp:
        assert resp.status == 200
        assert (await scrape(proxied, "apiserver_longrunning_requests"))[gauge] == 1
        release.set()
        await resp.read()
    sample = proxied.server.gateway.metrics.registry.get_sample_value
    await until(
        lambda: sample("apiserver_longrunning_requests", dict(gauge)) == 0,
        what="the watch to leave the gauge",
    )


def fixed(subresource: str, component: str, code: str = "200") -> tuple[tuple[str, str], ...]:
    """The labels of a handler upstream wraps in `InstrumentHandlerFunc` with fixed labels."""
    return labels(
        verb="GET", dry_run="", group="", version="", resource="", subresource=subresource,
        scope="", component=component, code=code,
    )  # fmt: skip


async def test_aggregated_discovery_and_openapi_v3_count_as_upstream_instruments_them(
    start_proxied: StartProxied,
) -> None:
    """aggregated.NewResourceManager("apis") counts only the aggregated document (a legacy /apis is
    not instrumented); kube-aggregator's OpenAPI v3 handlers count under `openapi/v3` and
    `openapi/v3/` with no component."""
    proxied = await start_proxied()
    async with proxied.request("GET", "/apis", headers={"Accept": AGG_TYPE}) as resp:
        assert resp.status == 200 and "apidiscovery.k8s.io" in resp.headers["Content-Type"]
    async with proxied.request("GET", "/apis") as resp:
        assert resp.status == 200 and "apidiscovery.k8s.io" not in resp.headers["Content-Type"]
    async with proxied.request("GET", "/openapi/v3") as resp:
        assert resp.status == 200
        paths = (await resp.json())["paths"]
    first = sorted(paths)[0]  # local mode: at least apiregistration.k8s.io's document
    async with proxied.request("GET", paths[first]["serverRelativeURL"]) as resp:
        assert resp.status == 200
    counted = await scrape(proxied, "apiserver_request_total")
    assert counted[fixed("apis", "apiserver")] == 1  # the legacy request is not among them
    assert counted[fixed("openapi/v3", "")] == 1
    assert counted[fixed("openapi/v3/", "")] == 1
