"""Requests RFC 9113 calls malformed never reach a backend, whatever the HTTP/2 library version,
and answers a client will not take never hold a stream or a connection forever.

- Whitespace or a control character in `:path` or `:method` (RFC 9113 8.3.1): a stream error.
  Written into the backend's HTTP/1.1 request line, a space would let the backend route a path
  other than the one the gateway authorized. The same request over HTTP/1.1 is a 400.
- CR or LF inside a header value (RFC 9113 8.2.1): a stream error; forwarded, it would become a
  header of its own at the backend (an `X-Remote-User` before the gateway's).
- A `content-length` that is not digits (`+146`): a stream error, never forwarded as is.
- An answer the gateway writes itself to a client that never opens its flow-control window ends
  at the request timeout (kube-apiserver's timeout filter), and a connection the gateway sent
  GOAWAY (an anonymous caller's) then closes: it cannot be held open with stalled streams.
"""

from __future__ import annotations

import asyncio

import pytest
from h2.errors import ErrorCodes

from tests.support.backend import PREFIX
from tests.support.fixtures import StartProxied
from tests.support.h2client import RawH2
from tests.support.pki import PKI
from tests.support.rawhttp import RawConnection

# Both header collectors (conftest.py): the checks must hold whichever decoded the block.
pytestmark = [pytest.mark.uvloop, pytest.mark.usefixtures("header_collector")]

THINGS = f"{PREFIX}/namespaces/default/things"
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"{THINGS} HTTP/1.1\r\nX-Remote-User: admin\r\n\r\nGET /{PREFIX}/x"),
        ("GET", f"{THINGS} /../secrets"),
        ("GET", f"{THINGS}\t/../secrets"),
        ("GET", f"{THINGS}\x0b/../secrets"),
        ("GET /secrets", THINGS),
        ("GET\t", THINGS),
    ],
    ids=["crlf-in-path", "space-in-path", "tab-in-path", "vt-in-path", "space-in-method", "tab-in-method"],
)
async def test_whitespace_in_path_or_method_is_a_stream_error_never_forwarded(
    start_proxied: StartProxied, pki: PKI, method: str, path: str
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        client.send(client.headers(1, block=client.block(method, path)))
        await client.until(lambda: 1 in client.resets)
        assert client.resets[1] == ErrorCodes.PROTOCOL_ERROR
        assert 1 not in client.answered
        # The connection goes on: the next request is served.
        client.send(client.headers(3, "GET", THINGS))
        await client.until(lambda: 3 in client.ended)
        assert client.statuses[3] == 200
    assert [r.raw_path for r in proxied.backend.seen_by("admin")] == [THINGS]


async def test_the_same_request_line_over_http1_is_a_400(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    client = await RawConnection.open(proxied.server.port, pki)
    client.send(f"GET {THINGS} /../secrets HTTP/1.1\r\nHost: gateway.test\r\n\r\n".encode())
    answer = await client.answer()
    client.close()
    assert answer.status == 400
    assert proxied.backend.seen_by("admin") == []


@pytest.mark.parametrize(
    "header",
    [
        ("x-note", "ok\r\nX-Remote-User: admin"),
        ("x-note", "ok\nX-Remote-Group: system:masters"),
        ("x-note", "ok\x00"),
        ("x-note ", "space in the name"),
        ("X-Upper", "an uppercase name"),
    ],
    ids=["crlf-in-value", "lf-in-value", "nul-in-value", "space-in-name", "uppercase-name"],
)
async def test_an_illegal_header_field_is_a_stream_error_never_forwarded(
    start_proxied: StartProxied, pki: PKI, header: tuple[str, str]
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        client.send(client.headers(1, block=client.block("GET", THINGS, [header])))
        await client.until(lambda: 1 in client.resets)
        assert client.resets[1] == ErrorCodes.PROTOCOL_ERROR
    assert proxied.backend.seen_by("admin") == []
    assert not any(header[1] in (r.one("X-Note") or "") for r in proxied.backend.received)


async def test_fields_of_a_header_block_refused_midway_never_reach_the_next_request(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """libnghttp2 refuses a block at its first illegal field, after the fields before it were
    decoded: those are dropped with the block, never counted into the next stream's request."""
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        refused = client.block("GET", THINGS, [("x-note", "first"), ("X-Upper", "an uppercase name")])
        served = client.block("GET", THINGS, [("x-note", "second")])
        client.send(client.headers(1, block=refused), client.headers(3, block=served))  # one read
        await client.until(lambda: 1 in client.resets and 3 in client.ended)
        assert client.resets[1] == ErrorCodes.PROTOCOL_ERROR
        assert client.statuses[3] == 200
    [request] = proxied.backend.seen_by("admin")
    assert request.all("X-Note") == ["second"]


@pytest.mark.parametrize("length", ["+3", "-3", "3, 3", "0x3", " 3"])
async def test_a_content_length_that_is_not_digits_is_a_stream_error(
    start_proxied: StartProxied, pki: PKI, length: str
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        block = client.block("POST", THINGS, [("content-type", "application/json"), ("content-length", length)])
        client.send(client.headers(1, block=block, end_stream=False))
        await client.until(lambda: 1 in client.resets)
        assert client.resets[1] == ErrorCodes.PROTOCOL_ERROR
    assert proxied.backend.seen_by("admin") == []


async def test_an_answer_the_client_never_takes_ends_at_the_request_timeout(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """The gateway's own answers (here `/openapi/v2`, a large document) wait within the client's
    window like any other; a client that never opens its window gets the stream reset once the
    request timeout is over, as kube-apiserver's timeout filter ends it."""
    proxied = await start_proxied(request_timeout=1.0)
    async with RawH2.connect(
        proxied.server.port, pki.client_context("admin"), settings={SETTINGS_INITIAL_WINDOW_SIZE: 0}
    ) as client:
        await client.round_trip()  # our window of 0 is in force
        client.send(client.headers(1, "GET", "/openapi/v2"))
        await client.until(lambda: 1 in client.answered)  # the head went out; the body cannot
        await client.until(lambda: 1 in client.resets, timeout=10)
        assert 1 not in client.ended
        # The connection goes on.
        client.send(client.headers(3, "HEAD", "/livez"))
        await client.until(lambda: 3 in client.ended)


async def test_an_anonymous_connection_with_a_stalled_answer_is_closed(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """UnauthenticatedHTTP2DOSMitigation sends GOAWAY after an anonymous caller's answer; if that
    answer can never be sent (window 0), the stream ends at the request timeout and the
    connection closes: stalled streams cannot keep it open."""
    proxied = await start_proxied(request_timeout=1.0)
    async with RawH2.connect(
        proxied.server.port, pki.client_context(None), settings={SETTINGS_INITIAL_WINDOW_SIZE: 0}
    ) as client:
        await client.round_trip()
        client.send(client.headers(1, "GET", "/livez?verbose"))  # public: served as anonymous
        await client.until(lambda: client.goaway is not None)
        assert client.goaway is not None and client.goaway.error_code == ErrorCodes.NO_ERROR
        await asyncio.wait_for(client.until(lambda: client.closed, timeout=20), 20)
