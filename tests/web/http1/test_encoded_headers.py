"""Header lines encoded once (`serverrequest.EncodedHeaders`) and written at the end of an HTTP/1.1
head as they are (`GatewayResponse`, `GatewayStreamResponse`): over the wire, the head is byte for
byte the one aiohttp writes with the same headers added last, and a value aiohttp would refuse is
never written unchecked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from multidict import CIMultiDict, istr

from aggregator.web.http1.request import serve_http1
from aggregator.web.http1.server import GatewayRequest
from aggregator.web.serverrequest import EncodedHeaders, Response

PAIRS = ((istr("X-Kubernetes-Pf-Prioritylevel-Uid"), "pl-uid"), (istr("X-Kubernetes-Pf-Flowschema-Uid"), "fs-uid"))
Pipeline = Callable[..., object]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Pipeline], asyncio.Future[int]]]:
    """Serve a pipeline over HTTP/1.1 as the gateway does (`serve_http1`, `GatewayRequest`); the port."""
    runners: list[web.ServerRunner] = []

    async def start(pipeline: Pipeline) -> int:
        loop = asyncio.get_running_loop()

        def make_request(message: object, payload: object, protocol: object, writer: object, task: object) -> web.Request:
            return GatewayRequest(message, payload, protocol, writer, task, loop)  # type: ignore[arg-type]

        runner = web.ServerRunner(web.Server(serve_http1(pipeline), request_factory=make_request))  # type: ignore[arg-type]
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]  # type: ignore[no-any-return]

    yield start  # type: ignore[misc]
    for runner in runners:
        await runner.cleanup()


async def head_of(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: gateway\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    return b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"Date:"))


def answering(add: Callable[[object, CIMultiDict[str]], None], *, streamed: bool, head_now: bool = True) -> Pipeline:
    async def pipeline(request: object) -> None:
        def on_head(_status: int, headers: CIMultiDict[str]) -> None:
            add(request, headers)

        request.on_head = on_head  # type: ignore[attr-defined]
        if streamed:
            answer = await request.stream(200, CIMultiDict({"Content-Length": "2"}), head_now=head_now)  # type: ignore[attr-defined]
            await answer.finish(b"{}")
        else:
            await request.respond(Response(200, b"{}", content_type="application/json"))  # type: ignore[attr-defined]

    return pipeline


def encoded(request: object, headers: CIMultiDict[str]) -> None:
    request.add_encoded_headers(headers, EncodedHeaders(PAIRS))  # type: ignore[attr-defined]


def added(_request: object, headers: CIMultiDict[str]) -> None:
    headers.extend(PAIRS)


@pytest.mark.parametrize(("streamed", "head_now"), [(False, True), (True, True), (True, False)])
async def test_encoded_lines_end_the_head_as_aiohttp_writes_the_same_headers_added_last(
    serve: Callable[[Pipeline], asyncio.Future[int]], streamed: bool, head_now: bool
) -> None:
    spliced = await head_of(await serve(answering(encoded, streamed=streamed, head_now=head_now)))
    assert spliced == await head_of(await serve(answering(added, streamed=streamed, head_now=head_now)))
    assert spliced.endswith(b"\r\nX-Kubernetes-Pf-Prioritylevel-Uid: pl-uid\r\nX-Kubernetes-Pf-Flowschema-Uid: fs-uid\r\n\r\n")


@pytest.mark.parametrize("value", ["a\r\nInjected: yes", "a\nb", "a\x00", "a\x7f"])
async def test_a_value_aiohttp_refuses_is_not_encoded_so_it_is_refused_as_before(
    serve: Callable[[Pipeline], asyncio.Future[int]], value: str
) -> None:
    unsafe = EncodedHeaders(((istr("X-A"), "fine"), (istr("X-B"), value)))
    assert unsafe.lines is None

    def add(request: object, headers: CIMultiDict[str]) -> None:
        request.add_encoded_headers(headers, unsafe)  # type: ignore[attr-defined]

    port = await serve(answering(add, streamed=False))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: gateway\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)  # aiohttp refuses the head: no injected line
    writer.close()
    assert b"Injected" not in answer and b"X-B" not in answer


def test_a_tab_and_non_ascii_are_encoded_as_aiohttp_encodes_them() -> None:
    assert EncodedHeaders(((istr("X-A"), "a\tb é"),)).lines == "X-A: a\tb é\r\n".encode()
