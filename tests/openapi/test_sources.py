"""One source's refresh against a scripted server: what is kept, dropped, retried and logged."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from multidict import CIMultiDict

from aggregator.openapi.sources import Answer, OpenAPISource
from aggregator.util.backoff import exponential_delay

KEY = "apis/g.example.com/v1"


class Server:
    """Answers by path; records (path, query, headers)."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.seen: list[tuple[str, dict[str, str], dict[str, str]]] = []

    def set(self, path: str, status: int, body: Any = b"", **headers: str) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers[path] = Answer(status, CIMultiDict(headers), data)

    async def __call__(self, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer:
        self.seen.append((path, dict(query), dict(headers)))
        return self.answers.get(path, Answer(404, CIMultiDict(), b"404 page not found"))


def source(server: Server) -> OpenAPISource:
    return OpenAPISource("ns/api:443", server, wants=lambda key: key == KEY)


async def test_a_broken_v2_keeps_the_last_good_one_and_its_etag_is_not_reused() -> None:
    server = Server()
    server.set("/openapi/v3", 200, {"paths": {}})
    server.set("/openapi/v2", 200, {"swagger": "2.0", "paths": {}}, ETag='"A"')
    src = source(server)
    assert (await src.refresh()).v2_changed
    good = src.v2
    server.set("/openapi/v2", 200, b"<html>not json", ETag='"B"')
    result = await src.refresh()
    assert not result.ok and src.v2 == good and "not JSON" in src.last_error
    await src.refresh()
    assert server.seen[-1][2]["If-None-Match"] == '"A"'  # not the broken answer's ETag
    server.set("/openapi/v2", 304, b"", ETag='"A"')
    assert (await src.refresh()).ok and src.v2 == good


async def test_304_without_a_previous_download_is_an_error() -> None:
    server = Server()
    server.set("/openapi/v3", 200, {"paths": {}})
    server.set("/openapi/v2", 304)
    src = source(server)
    result = await src.refresh()
    assert not result.ok and "304 Not Modified without a previous download" in src.last_error


async def test_index_urls_elsewhere_are_not_followed_and_a_listed_document_that_404s_is_an_error() -> None:
    server = Server()
    server.set("/openapi/v3", 200, {"paths": {KEY: {"serverRelativeURL": "/api/v1/secrets?hash=X"}}})
    server.set(f"/openapi/v3/{KEY}", 200, {"openapi": "3.0.0"})
    server.set("/openapi/v2", 404)
    src = source(server)
    result = await src.refresh()
    assert result.v3_changed and not result.ok  # v2 not published
    assert [s[0] for s in server.seen[:2]] == ["/openapi/v3", f"/openapi/v3/{KEY}"]
    assert server.seen[1][1] == {}  # no hash: conditional on the ETag instead
    assert src.v2_published is False and src.v3_published is True

    del server.answers[f"/openapi/v3/{KEY}"]
    server.set("/openapi/v3", 200, {"paths": {KEY: {"serverRelativeURL": f"/openapi/v3/{KEY}?hash=NEW"}}})
    result = await src.refresh()
    assert not result.ok and KEY in src.v3  # kept: a broken server is not an unpublished document
    assert "HTTP 404" in src.last_error


async def test_404_is_logged_once_then_quietly_and_drops_the_documents(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server()
    server.set("/openapi/v3", 200, {"paths": {KEY: {"serverRelativeURL": f"/openapi/v3/{KEY}?hash=H"}}})
    server.set(f"/openapi/v3/{KEY}", 200, {"openapi": "3.0.0"})
    server.set("/openapi/v2", 200, {"swagger": "2.0"})
    src = source(server)
    await src.refresh()
    assert src.v3 and src.v2 is not None
    server.answers.clear()
    with caplog.at_level(logging.DEBUG, logger="aggregator.openapi.sources"):
        for _ in range(3):
            result = await src.refresh()
            assert not result.ok
    assert src.v3 == {} and src.v2 is None and src.failures == 3
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert sorted(r.getMessage() for r in loud) == [
        "source publishes no OpenAPI v2; retrying with backoff",
        "source publishes no OpenAPI v3; retrying with backoff",
    ]


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [exponential_delay(n, 1.0, 300.0) for n in (1, 2, 3, 9, 10, 100)] == [1, 2, 4, 256, 300, 300]
