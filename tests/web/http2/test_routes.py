"""Every route answers the same over HTTP/2 as over HTTP/1.1, on the same port.

The gateway runs as shipped (ALPN offers h2 and http/1.1); an aiohttp client (no ALPN: HTTP/1.1)
and an HTTP/2 client (the h2 library, or curl --http2) ask the same questions and must get the
same answers: discovery with its ETag and 304, OpenAPI with gzip, health, metrics, /version, the
proxy to an extension server (which sees the same identity and the same header names), a request
body through the proxy, and the 404 Status of an unknown path.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil

import pytest
from aiohttp import web

from tests.support.backend import PREFIX
from tests.support.fixtures import Proxied, StartProxied
from tests.support.h2client import H2Client
from tests.support.pki import PKI

# The production loop: its TLS transport is no asyncio.Transport, and it reports failures its own way.
pytestmark = pytest.mark.uvloop

SAME_ANSWER = [
    "/apis",
    "/apis/demo.example.com",
    "/apis/demo.example.com/v1",
    f"{PREFIX}/namespaces/default/things?limit=5&watch=false",
    "/openapi/v2",
    "/openapi/v3",
    "/healthz",
    "/livez?verbose",
    "/version",
    "/api/v1/namespaces",  # local mode: 404 Status
]
HEADERS_COMPARED = ("content-type", "etag", "content-encoding", "cache-control", "vary")


async def over_h1(
    proxied: Proxied, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with proxied.request("GET", path, headers=headers or {}) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


async def test_every_route_answers_the_same_over_both_protocols(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        asked = {"Accept": "*/*", "Accept-Encoding": "gzip, deflate"}
        for path in SAME_ANSWER:
            status, headers, body = await over_h1(proxied, path, asked)
            answer = await client.get(path, asked.items())
            assert answer.status == status, path
            assert answer.body == body, path
            for name in HEADERS_COMPARED:
                assert answer.header(name) == headers.get(name), (path, name)
        # /metrics is a moving target; it answers, in the same format
        metrics = await client.get("/metrics")
        assert metrics.status == 200 and b"apiserver_request_total" in metrics.body
    # one HTTP/2 connection carried all of it
    assert connections(proxied, "h2") == 1


def connections(proxied: Proxied, protocol: str) -> float:
    value = proxied.server.connection_metrics.connections.labels(protocol)._value.get()
    return float(value)


async def test_the_backend_sees_the_same_request_whichever_protocol_the_client_spoke(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    path = f"{PREFIX}/namespaces/default/things?labelSelector=a%3Db"
    headers = {"Accept": "application/json", "User-Agent": "tester/1.0", "X-Custom-Thing": "1"}
    await over_h1(proxied, path, headers)
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        answer = await client.get(path, headers.items())
    assert answer.status == 200
    assert json.loads(answer.body)["user"] == "admin"  # identity from the connection's certificate
    h1, h2 = [r for r in proxied.backend.received if r.raw_path == path]
    assert h2.peer_cn == h1.peer_cn == "front-proxy-client"

    def comparable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        varying = {"audit-id", "x-forwarded-for", "content-length", "accept-encoding", "host"}
        return [(k, v) for k, v in headers if k.lower() not in varying]

    assert comparable(h2.headers) == comparable(h1.headers)  # Go's canonical names, same order


async def test_a_request_body_reaches_the_backend_whole(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    body = bytes(range(256)) * 4096  # 1 MiB: four times the stream's window
    seen: list[bytes] = []

    async def store(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"size": len(seen[-1])}, status=201)

    proxied.backend.routes[f"{PREFIX}/namespaces/default/things"] = store
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        sid = client.request(
            "POST",
            f"{PREFIX}/namespaces/default/things",
            [("content-type", "application/octet-stream")],
            end=False,
        )
        for start in range(0, len(body), 16384):
            chunk = body[start : start + 16384]
            await client.until(lambda: client.h2.local_flow_control_window(sid) >= 16384)
            client.send_data(sid, chunk)
        client.send_data(sid, b"", end=True)
        answer = await client.response(sid)
    assert answer.status == 201 and json.loads(answer.body) == {"size": len(body)}
    assert seen == [body]


async def test_a_body_that_ends_with_trailers_reaches_the_backend_whole(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """A request whose body ends with a trailer block (gRPC-style clients send one): the second
    header block on the stream is its end, not a new request, on a stream opened after others."""
    proxied = await start_proxied()
    seen: list[bytes] = []

    async def store(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"size": len(seen[-1])}, status=201)

    things = f"{PREFIX}/namespaces/default/things"
    proxied.backend.routes[things] = store
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        first = client.request("POST", things, [("content-type", "application/octet-stream")], end=False)
        second = client.request("POST", things, [("content-type", "application/octet-stream")], end=False)
        client.send_data(first, b"first body")
        client.send_data(second, b"second body")
        for sid in (first, second):
            client.h2.send_headers(sid, [("x-checksum", str(sid))], end_stream=True)
            client.flush()
        answers = [await client.response(first), await client.response(second)]
    assert [a.status for a in answers] == [201, 201]
    assert sorted(seen) == [b"first body", b"second body"]


async def test_an_answer_given_before_the_body_ended_arrives_whole_before_the_reset(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """The gateway answers a request whose body is still coming (kubectl's `auth can-i` met this):
    the answer arrives whole, and only then the stream is reset with NO_ERROR (Go's server); a
    reset sent ahead of the answer's DATA is a stream error for the client."""
    proxied = await start_proxied()
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        for _ in range(3):
            sid = client.request("POST", "/version", [("content-type", "application/json")], end=False)
            client.send_data(sid, b'{"kind":')  # the rest never comes
            answer = await client.response(sid)
            assert answer.status in (200, 405) and answer.body
        assert (await client.get("/livez")).status == 200


async def test_discovery_etag_and_openapi_gzip_over_curl_http2(start_proxied: StartProxied, pki: PKI) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: apt-get install curl (.ci/run does)")
    proxied = await start_proxied()
    _, headers, _ = await over_h1(proxied, "/apis")
    etag = headers["etag"]
    head, got = await curl(pki, proxied.server.url + "/apis", "-H", f"If-None-Match: {etag}")
    assert head.startswith("HTTP/2 304") and got == b""
    _, _, v2 = await over_h1(proxied, "/openapi/v2", {"Accept-Encoding": "identity"})
    head, got = await curl(pki, proxied.server.url + "/openapi/v2", "-H", "Accept-Encoding: gzip")
    assert head.startswith("HTTP/2 200") and "content-encoding: gzip" in head.lower()
    assert gzip.decompress(got) == v2


async def curl(pki: PKI, url: str, *args: str) -> tuple[str, bytes]:
    """curl --http2 as the admin user: the response head and body."""
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--http2", "-D", "-", "--cacert", pki.path("ca.crt"),
        "--cert", pki.path("admin.crt"), "--key", pki.path("admin.key"), *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    head, _, body = out.partition(b"\r\n\r\n")
    assert process.returncode == 0, err.decode()
    return head.decode(), body


async def test_curl_through_the_proxy_carries_the_certificates_identity(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """curl's own HTTP/2 (nghttp2) against the proxy: the answer and the identity as over HTTP/1.1."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: apt-get install curl (.ci/run does)")
    proxied = await start_proxied()
    head, body = await curl(pki, proxied.server.url + f"{PREFIX}/namespaces/default/things")
    assert head.startswith("HTTP/2 200")
    assert json.loads(body)["user"] == "admin"
