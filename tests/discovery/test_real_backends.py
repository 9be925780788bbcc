"""Discovery through the real proxy transport: TLS fake backends (aggregated, legacy-only, 503, hang, 304)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from aggregator.discovery.component import Discovery
from tests.discovery.fakes import AGG_TYPE, aggregated_doc, resource
from tests.support.backend import GROUP, PREFIX, VERSION
from tests.support.fixtures import Proxied, StartProxied, backend, backend_pki, start_proxied  # noqa: F401 - fixtures
from tests.support.polling import until

DOC = aggregated_doc({GROUP: {VERSION: [resource("widgets", "Widget", short=["wd"])]}})


def fast(proxied: Proxied) -> Discovery:
    discovery = proxied.server.gateway.control.discovery
    fetcher = discovery.fetcher
    fetcher.backoff_initial, fetcher.backoff_max, fetcher.timeout = 0.02, 0.2, 0.5
    for name in fetcher.states:
        fetcher.poke(name)
    return discovery


async def aggregated(proxied: Proxied) -> dict[str, Any]:
    async with proxied.request("GET", "/apis", headers={"Accept": AGG_TYPE}) as resp:
        assert resp.status == 200
        return {i["metadata"]["name"]: i["versions"] for i in json.loads(await resp.read())["items"]}


async def test_aggregated_backend_then_304_then_503_then_hang(start_proxied: StartProxied) -> None:  # noqa: F811
    state: dict[str, Any] = {"mode": "ok"}
    hanging = asyncio.Event()

    async def apis(request: web.Request) -> web.StreamResponse:
        if state["mode"] == "503":
            return web.Response(status=503, text="down")
        if state["mode"] == "hang":
            hanging.set()
            await asyncio.sleep(3600)  # never answers
        if request.headers.get("If-None-Match") == '"V1"':
            return web.Response(status=304, headers={"ETag": '"V1"'})
        return web.Response(body=DOC, headers={"Content-Type": AGG_TYPE, "ETag": '"V1"'})

    proxied = await start_proxied()
    proxied.backend.routes["/apis"] = apis
    discovery = fast(proxied)
    fetch_state = discovery.fetcher.states[f"{VERSION}.{GROUP}"]
    await until(lambda: fetch_state.fresh)
    assert (await aggregated(proxied))[GROUP] == [
        {
            "version": VERSION,
            "resources": [resource("widgets", "Widget", short=["wd"])],
            "freshness": "Current",
        }
    ]
    # (the availability check's GET of the group-version comes first: the fetch follows its verdict)
    first = next(r for r in proxied.backend.seen_by("system:kube-aggregator") if r.raw_path == "/apis")
    accept = first.one("Accept")
    assert accept is not None and accept.startswith(AGG_TYPE)
    assert first.all("X-Remote-Group") == ["system:masters"]
    assert first.peer_cn == "front-proxy-client"

    discovery.fetcher.poke(f"{VERSION}.{GROUP}")
    await until(lambda: any(r.one("If-None-Match") == '"V1"' for r in proxied.backend.received))
    assert fetch_state.fresh

    state["mode"] = "503"
    discovery.fetcher.poke(f"{VERSION}.{GROUP}")
    await until(lambda: not fetch_state.fresh)
    versions = (await aggregated(proxied))[GROUP]
    assert versions[0]["freshness"] == "Stale" and versions[0]["resources"][0]["resource"] == "widgets"

    state["mode"] = "hang"
    discovery.fetcher.poke(f"{VERSION}.{GROUP}")
    await asyncio.wait_for(hanging.wait(), 10)
    # the fetch in flight hangs for an hour: any answer at all comes from the rendered document
    versions = (await asyncio.wait_for(aggregated(proxied), 10))[GROUP]
    assert versions[0]["freshness"] == "Stale" and versions[0]["resources"]


async def test_legacy_only_backend_is_converted(start_proxied: StartProxied) -> None:  # noqa: F811
    async def apis(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def group_version(_request: web.Request) -> web.StreamResponse:
        doc: Mapping[str, Any] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{GROUP}/{VERSION}",
            "resources": [
                {
                    "name": "gadgets",
                    "singularName": "gadget",
                    "namespaced": False,
                    "kind": "Gadget",
                    "verbs": ["get", "list"],
                },
                {
                    "name": "gadgets/status",
                    "singularName": "",
                    "namespaced": False,
                    "kind": "Gadget",
                    "verbs": ["get"],
                },
            ],
        }
        return web.json_response(doc)

    proxied = await start_proxied()
    proxied.backend.routes["/apis"] = apis
    proxied.backend.routes[PREFIX] = group_version
    discovery = fast(proxied)
    await until(lambda: discovery.fetcher.states[f"{VERSION}.{GROUP}"].fresh)
    (version,) = (await aggregated(proxied))[GROUP]
    assert version["resources"] == [
        {
            "resource": "gadgets",
            "responseKind": {"group": "", "version": "", "kind": "Gadget"},
            "scope": "Cluster",
            "singularResource": "gadget",
            "verbs": ["get", "list"],
            "subresources": [
                {
                    "subresource": "status",
                    "responseKind": {"group": "", "version": "", "kind": "Gadget"},
                    "verbs": ["get"],
                }
            ],
        }
    ]
