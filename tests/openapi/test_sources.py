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


# --- kube-openapi's stale-hash redirect, and every other redirect ---------------------------------------

OTHER = "apis/other.example.com/v1"
DOC_PATH = f"/openapi/v3/{KEY}"


def index(**hashes: str) -> dict[str, Any]:
    keys = {"main": KEY, "other": OTHER}
    return {
        "paths": {
            keys[k]: {"serverRelativeURL": f"/openapi/v3/{keys[k]}?hash={h}"} for k, h in hashes.items()
        }
    }


class Settling(Server):
    """A server whose document for KEY moves to a new hash `moves` times, as kube-openapi answers:
    the index lists the hash of the moment, and a GET with an older one is a 301 to the current."""

    def __init__(self, moves: int) -> None:
        super().__init__()
        self.moves = moves
        self.current = "H0"
        self.set("/openapi/v2", 404)

    async def __call__(self, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer:
        self.seen.append((path, dict(query), dict(headers)))
        if path == "/openapi/v3":
            answer = Answer(200, CIMultiDict(), json.dumps(index(main=self.current)).encode())
            if self.moves > 0:  # the document changes right after the index was read
                self.moves -= 1
                self.current = f"H{int(self.current[1:]) + 1}"
            return answer
        if path == DOC_PATH:
            if query.get("hash") != self.current:
                location = f"{DOC_PATH}?hash={self.current}"
                return Answer(
                    301, CIMultiDict({"Location": location, "Content-Type": "application/json"}), b""
                )
            return Answer(200, CIMultiDict(), json.dumps({"openapi": "3.0.0", "rev": self.current}).encode())
        return await super().__call__(path, query, headers)


async def test_a_stale_hash_redirect_means_read_the_index_again_never_follow_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Settling(moves=2)
    src = source(server)
    with caplog.at_level(logging.INFO, logger="aggregator.openapi.sources"):
        result = await src.refresh()
    assert result.v3_changed and json.loads(src.v3[KEY].body)["rev"] == "H2"
    assert src.v3_fetched and src.last_error == ""
    v3 = [(path, query.get("hash")) for path, query, _ in server.seen if path.startswith("/openapi/v3")]
    assert v3 == [
        ("/openapi/v3", None),
        (DOC_PATH, "H0"),  # 301 to H1: the index is read again, the Location is never requested
        ("/openapi/v3", None),
        (DOC_PATH, "H1"),  # 301 to H2
        ("/openapi/v3", None),
        (DOC_PATH, "H2"),
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # not a failure


async def test_hashes_that_never_hold_still_fail_the_refresh_and_the_rest_is_served() -> None:
    server = Settling(moves=100)
    server.set(f"/openapi/v3/{OTHER}", 200, {"openapi": "3.0.0", "other": True})
    good = index(other="O1")

    async def call(path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer:
        answer = await server(path, query, headers)
        if path == "/openapi/v3":  # the index also lists a document that holds still
            doc = json.loads(answer.body)
            doc["paths"].update(good["paths"])
            return Answer(200, CIMultiDict(), json.dumps(doc).encode())
        return answer

    src = OpenAPISource("ns/api:443", call, wants=lambda key: key in (KEY, OTHER))
    result = await src.refresh()
    assert not result.ok and result.v3_changed
    assert list(src.v3) == [OTHER] and not src.v3_fetched
    assert f"the hash of {KEY} kept moving over 3 reads of the index" in src.last_error
    assert [p for p, _, _ in server.seen].count("/openapi/v3") == 3


@pytest.mark.parametrize(
    "location",
    [
        f"/openapi/v3/{OTHER}?hash=H1",  # another document
        "/api/v1/namespaces/kube-system/secrets?hash=H1",  # not OpenAPI at all
        f"https://evil.example.com{DOC_PATH}?hash=H1",  # another host
        f"//evil.example.com{DOC_PATH}?hash=H1",  # another host, scheme-relative
        f"{DOC_PATH}?hash=H1&watch=true",  # more than the hash
        f"{DOC_PATH}?hash=",  # no hash at all
        f"{DOC_PATH}?hash=H1#frag",
        "",
    ],
)
async def test_any_other_redirect_is_refused_and_never_followed(location: str) -> None:
    server = Server()
    server.set("/openapi/v3", 200, index(main="H0"))
    server.set(DOC_PATH, 301, b"", Location=location)
    server.set("/openapi/v2", 404)
    src = source(server)
    result = await src.refresh()
    assert not result.ok and src.v3 == {}
    assert [p for p, _, _ in server.seen] == ["/openapi/v3", DOC_PATH, "/openapi/v2"]  # no re-read, no follow
    assert f"GET {DOC_PATH}: HTTP 301: redirect to {location!r} refused (never followed)" in src.last_error


async def test_a_redirect_without_a_hash_asked_or_on_the_index_is_refused() -> None:
    server = Server()
    server.set("/openapi/v3", 200, {"paths": {KEY: {"serverRelativeURL": DOC_PATH}}})  # no hash listed
    server.set(DOC_PATH, 301, b"", Location=f"{DOC_PATH}?hash=H1")
    server.set("/openapi/v2", 404)
    src = source(server)
    assert not (await src.refresh()).ok and "refused" in src.last_error
    assert [p for p, _, _ in server.seen].count("/openapi/v3") == 1

    server.seen.clear()
    server.set("/openapi/v3", 302, b"", Location="/openapi/v3?page=2")
    assert not (await src.refresh()).ok
    assert "GET /openapi/v3: HTTP 302: redirect to '/openapi/v3?page=2' refused" in src.last_error
    assert [p for p, _, _ in server.seen] == ["/openapi/v3", "/openapi/v2"]


async def test_one_failing_document_keeps_its_last_copy_and_does_not_hold_back_the_others() -> None:
    server = Server()
    server.set("/openapi/v3", 200, index(main="A1", other="B1"))
    server.set(DOC_PATH, 200, {"openapi": "3.0.0", "v": "A1"})
    server.set(f"/openapi/v3/{OTHER}", 200, {"openapi": "3.0.0", "v": "B1"})
    server.set("/openapi/v2", 200, {"swagger": "2.0"})
    src = OpenAPISource("kube-apiserver", server, wants=lambda key: True)
    assert (await src.refresh()).ok and src.answered
    # both move; one of them now fails (a backend behind kube-apiserver's proxy went down)
    server.set("/openapi/v3", 200, index(main="A2", other="B2"))
    server.set(DOC_PATH, 503, b"service unavailable")
    server.set(f"/openapi/v3/{OTHER}", 200, {"openapi": "3.0.0", "v": "B2"})
    result = await src.refresh()
    assert not result.ok and result.v3_changed
    assert json.loads(src.v3[OTHER].body)["v"] == "B2"  # published although the other failed
    assert json.loads(src.v3[KEY].body)["v"] == "A1"  # its last good copy
    assert f"GET {DOC_PATH}: HTTP 503: service unavailable" in src.last_error
    server.set(DOC_PATH, 200, {"openapi": "3.0.0", "v": "A2"})
    assert (await src.refresh()).ok and json.loads(src.v3[KEY].body)["v"] == "A2"


async def test_answered_once_both_documents_came_or_were_not_published() -> None:
    server = Server()
    server.set("/openapi/v3", 503, b"starting")
    server.set("/openapi/v2", 200, {"swagger": "2.0"})
    src = source(server)
    assert src.first_attempt is None
    await src.refresh()
    assert src.first_attempt is not None and not src.answered  # v2 in, v3 not
    server.set("/openapi/v3", 404)
    await src.refresh()
    assert src.answered and not src.v3_fetched  # "none published" is an answer
