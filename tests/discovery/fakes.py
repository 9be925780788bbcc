"""An in-memory stand-in for the proxy transport's `fetch`, and backend discovery documents."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from aggregator.contracts import FetchedResponse
from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo

AGG_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass
class FakeResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


class Unreachable(Exception):
    """What the transport raises when a hop fails."""

    def __init__(self, hop: str, message: str) -> None:
        super().__init__(message)
        self.hop = hop


Handler = Callable[[str, Mapping[str, str]], FakeResponse | Exception | Awaitable[FakeResponse | Exception]]


class FakeBackends:
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.calls: list[tuple[str, str, dict[str, str], UserInfo]] = []

    async def fetch(
        self, apiservice: APIService, path: str, *, headers: Mapping[str, str], user: UserInfo, timeout: float
    ) -> FetchedResponse:
        self.calls.append((apiservice.name, path, dict(headers), user))
        handler = self.handlers.get(apiservice.name)
        if handler is None:
            raise Unreachable("resolve", f"no fake backend for {apiservice.name}")
        result = handler(path, headers)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Exception):
            raise result
        # What the real transport returns: headers read case-insensitively, as the fetcher must.
        return FetchedResponse(result.status, CIMultiDictProxy(CIMultiDict(result.headers)), result.body)


def resource(
    name: str, kind: str, *, scope: str = "Namespaced", short: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "resource": name,
        "responseKind": {"group": "", "version": "", "kind": kind},
        "scope": scope,
        "singularResource": name.rstrip("s"),
        "verbs": ["get", "list", "watch"],
    }
    if short:
        out["shortNames"] = short
    return out


def aggregated_doc(groups: dict[str, dict[str, list[dict[str, Any]]]]) -> bytes:
    items = [
        {
            "metadata": {"name": group},
            "versions": [
                {"version": v, "resources": res, "freshness": "Current"} for v, res in versions.items()
            ],
        }
        for group, versions in groups.items()
    ]
    return json.dumps(
        {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }
    ).encode()


def serve_aggregated(groups: dict[str, dict[str, list[dict[str, Any]]]], etag: str = '"E1"') -> Handler:
    body = aggregated_doc(groups)

    def handler(path: str, headers: Mapping[str, str]) -> FakeResponse:
        assert path == "/apis"
        if headers.get("If-None-Match") == etag:
            return FakeResponse(304, {"ETag": etag})
        return FakeResponse(200, {"Content-Type": AGG_TYPE, "ETag": etag}, body)

    return handler


def serve_legacy(group: str, version: str, resources: list[dict[str, Any]]) -> Handler:
    def handler(path: str, headers: Mapping[str, str]) -> FakeResponse:
        if path == "/apis":
            body = json.dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}).encode()
            return FakeResponse(200, {"Content-Type": "application/json"}, body)
        assert path == f"/apis/{group}/{version}"
        doc = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": resources,
        }
        return FakeResponse(200, {"Content-Type": "application/json"}, json.dumps(doc).encode())

    return handler


async def hang(_path: str, _headers: Mapping[str, str]) -> FakeResponse:
    await asyncio.sleep(3600)  # never answers
    raise AssertionError("unreachable")
