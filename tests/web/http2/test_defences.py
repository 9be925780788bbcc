"""Each HTTP/2 defence, attacked through the real gateway over TLS with frames a hostile client
writes by hand (`RawH2`): the attack is cut where kube-apiserver's (Go's) server cuts it, and the
gateway goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from aggregator.backends.bounds import CONNECT_TIMEOUT
from aggregator.runners.server import GatewayServer
from tests.support.backend import PREFIX, BackendPKI, FakeBackend, apiservice_manifest
from tests.support.fixtures import StartProxied
from tests.support.h2client import H2Client, RawH2
from tests.support.holding import Held
from tests.support.pki import PKI
from tests.support.polling import until

# The production loop: its TLS transport is no asyncio.Transport, and it reports failures its own way.
# Every defence with both header collectors (conftest.py), the compiled one and Python's.
pytestmark = [pytest.mark.long(30), pytest.mark.uvloop, pytest.mark.usefixtures("header_collector")]

THINGS = f"{PREFIX}/namespaces/default/things"
CALM = ErrorCodes.ENHANCE_YOUR_CALM


def resident_bytes() -> int:
    """This process's resident set size (the gateway runs in it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def goaways(server: GatewayServer, reason: str) -> int:
    return int(server.connection_metrics.goaways.labels(reason)._value.get())


def served(server: GatewayServer) -> int:
    """Requests the pipeline finished (any route, any code)."""
    return int(
        sum(
            s.value
            for m in server.gateway.metrics.pipeline.requests.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
    )


async def cut(client: RawH2, code: ErrorCodes) -> None:
    """The gateway sent GOAWAY `code`, then closed the connection."""
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None and client.goaway.error_code == code, client.goaway
    await client.until(lambda: client.closed)


async def test_a_rapid_reset_flood_of_2000_streams_is_cut_and_other_clients_are_served(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    held = Held()
    proxied.backend.routes[THINGS] = held
    port = proxied.server.port
    async with H2Client.connect(port, pki.client_context("admin")) as other:
        assert (await other.get("/livez")).status == 200
        async with RawH2.connect(port, pki.client_context("admin")) as flood:
            frames: list[bytes | RstStreamFrame] = []
            for n in range(2000):
                sid = 2 * n + 1
                frames += [
                    flood.headers(sid, "GET", THINGS),
                    RstStreamFrame(sid, error_code=ErrorCodes.CANCEL),
                ]
            flood.send(*frames)
            # The other connection is served while the flood is read, and after.
            during = await asyncio.gather(*(other.get("/livez") for _ in range(20)))
            await cut(flood, CALM)
        assert [a.status for a in during] == [200] * 20
        assert (await other.get("/readyz")).status == 200
    assert goaways(proxied.server, "rapid_reset") == 1
    # Handlers were bounded: far fewer than the 2000 streams ever reached the backend.
    assert proxied.server.http2 is not None
    limits = proxied.server.http2.limits
    assert held.arrived <= limits.max_streams
    # Cut once the streams reset before their handler started spent their budget (32 at once),
    # not after the 400 queued handlers Go's rule allows, nor after the stream limit's hundred:
    # the GOAWAY names the last stream processed.
    assert flood.goaway is not None
    assert flood.goaway.last_stream_id <= 2 * 50 + 1


async def test_a_client_that_cancels_what_it_waits_for_is_not_cut(
    start_proxied: StartProxied, pki: PKI, backend: FakeBackend, backend_pki: BackendPKI
) -> None:
    """Resets of streams whose handlers run (requests a client gave up on) spend only the general
    reset budget: three rounds of the stream limit, each cancelled, leave the connection open."""
    # 100 TLS dials at once to the fake backend: beyond the default 5 s on a loaded CI machine.
    registration = apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem)
    registration["metadata"]["annotations"] = {CONNECT_TIMEOUT: "60s"}
    proxied = await start_proxied(apiservice=registration)
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with H2Client.connect(proxied.server.port, pki.client_context("admin")) as client:
        for round_ in range(3):
            sids = [client.request("GET", THINGS) for _ in range(100)]
            await until(lambda: held.in_flight == 100, 90, "100 requests at the backend")
            for sid in sids:
                client.reset(sid)
            await until(lambda: held.in_flight == 0, 30, "every request cancelled")
            assert client.goaway is None, f"cut in round {round_}"
        assert (await client.get("/livez")).status == 200
    assert goaways(proxied.server, "rapid_reset") == 0


async def test_made_you_reset_streams_the_gateway_resets_spend_the_reset_budget(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """CVE-2025-8671: the client never sends RST_STREAM, it makes the gateway reset (a WINDOW_UPDATE
    that overflows the stream's window: FLOW_CONTROL_ERROR). Those resets count as the client's."""
    proxied = await start_proxied()
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        sid = 1
        for _batch in range(60):  # up to 3000 streams; the budget is 1000 at once, then 33/s
            batch = list(range(sid, sid + 100, 2))
            sid += 100
            flood.send(
                *[
                    frame
                    for s in batch
                    for frame in (
                        flood.headers(s, "GET", THINGS),
                        WindowUpdateFrame(s, window_increment=2**31 - 1),
                    )
                ]
            )
            # awaited here: the lambda never outlives this iteration's batch
            await flood.until(lambda: all(s in flood.resets for s in batch) or flood.goaway is not None)  # noqa: B023
            if flood.goaway is not None:
                break
            assert {flood.resets[s] for s in batch} == {ErrorCodes.FLOW_CONTROL_ERROR}
        await cut(flood, CALM)
        assert len(flood.resets) >= 1000
    assert goaways(proxied.server, "reset_flood") == 1


async def test_a_continuation_flood_is_cut_before_the_block_is_decoded(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    before = served(proxied.server)
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        block = flood.block("GET", "/livez")
        flood.send(HeadersFrame(1, block[:4]), *[ContinuationFrame(1, b"\x00") for _ in range(200)])
        await cut(flood, CALM)
    assert goaways(proxied.server, "continuation_flood") == 1
    assert served(proxied.server) == before


@pytest.mark.parametrize("broken", ["ping_of_nine_bytes", "undecodable_header_block"])
async def test_a_session_libnghttp2_ends_by_itself_is_closed(
    start_proxied: StartProxied, pki: PKI, broken: str
) -> None:
    """Errors libnghttp2 ends the session for without telling the gateway through a callback (a
    frame of the wrong size, nghttp2_session.c `session_handle_frame_size_error`) or with a
    positive return (HPACK): the gateway learns of the end from the GOAWAY it writes, then closes
    the connection as Go's server does."""
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        await client.round_trip()
        if broken == "ping_of_nine_bytes":  # RFC 9113 6.7: a PING is 8 bytes, else FRAME_SIZE_ERROR
            client.send(b"\x00\x00\x09\x06\x00\x00\x00\x00\x00" + b"\x00" * 9)
            code = ErrorCodes.FRAME_SIZE_ERROR
        else:  # an index past both tables: RFC 7541 2.3.3, COMPRESSION_ERROR
            client.send(client.headers(1, block=b"\xff\xff\xff\xff\x0f"))
            code = ErrorCodes.COMPRESSION_ERROR
        await cut(client, code)
    assert goaways(proxied.server, "protocol_error") == 1


async def test_a_header_block_past_twice_the_header_limit_is_refused_unread(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        flood.send(HeadersFrame(1, flood.block("GET", "/livez")))
        for _ in range(12):  # 2.4 MB of fragments, in frames under the 256 KiB frame limit
            flood.send(ContinuationFrame(1, b"\x00" * 200_000))
        await cut(flood, ErrorCodes.PROTOCOL_ERROR)
    assert goaways(proxied.server, "header_block") == 1


async def test_a_header_list_over_one_mebibyte_is_answered_431_and_the_connection_goes_on(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """HPACK indexing makes a header list of 1.2 MB from a 5 KB frame: past kube-apiserver's
    MaxHeaderBytes (1 MiB) the request is answered 431, as Go's server answers a truncated list
    (`handleHeaderListTooLong`), and a list just under it is served."""
    proxied = await start_proxied()
    big = ("x-big", "a" * 4000)
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        client.send(client.headers(1, block=client.block("GET", "/livez", [big] * 220)))  # 887 KB
        await client.until(lambda: 1 in client.ended)
        assert client.statuses[1] == 200
        block = client.block("GET", "/livez", [big] * 300)  # 1.21 MB
        assert len(block) < 6000
        client.send(client.headers(3, block=block))
        await client.until(lambda: 3 in client.ended)
        assert client.statuses[3] == 431
        client.send(client.headers(5))
        await client.until(lambda: 5 in client.ended)
        assert client.statuses[5] == 200
        assert client.goaway is None


async def test_header_lists_on_every_stream_pin_a_few_mebibytes_not_hundreds(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """100 streams, each a header list just under 1 MiB made of one-byte references to one table
    entry (about 40 KiB on the wire in all, sent at once): the connection keeps at most
    `max_header_bytes_held` of decoded headers (the rest are answered 431), so resident memory
    grows by a few MiB, not the 270-315 MB the whole lists would take."""
    proxied = await start_proxied()
    big = ("x-big", "a" * 4000)
    before = resident_bytes()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        block = client.block("GET", "/livez", [big] * 250)  # 1.0 MB decoded, under 1 MiB
        client.send(*[client.headers(1 + 2 * n, block=block) for n in range(100)])
        await client.until(lambda: len(client.ended) == 100)
        grown = resident_bytes() - before
    refused = sum(1 for status in client.statuses.values() if status == 431)
    served = sum(1 for status in client.statuses.values() if status == 200)
    assert refused >= 90 and refused + served == 100, client.statuses
    assert grown < 48 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"


@pytest.mark.parametrize("kind", ["PING", "SETTINGS"])
async def test_a_flood_of_frames_that_demand_an_answer_is_cut(
    start_proxied: StartProxied, pki: PKI, kind: str
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        frame = PingFrame(0, b"floodme!") if kind == "PING" else SettingsFrame(0, settings={0x3: 100})
        flood.send(*[frame] * 1100)  # past the burst of 1000
        await cut(flood, CALM)
    assert goaways(proxied.server, "control_flood") == 1


async def test_a_settings_frame_with_more_than_100_entries_is_refused(
    start_proxied: StartProxied, pki: PKI
) -> None:
    proxied = await start_proxied()
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        entries = b"\x00\x03\x00\x00\x00\x64" * 101  # MAX_CONCURRENT_STREAMS=100, 101 times
        flood.send(len(entries).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + entries)
        await cut(flood, ErrorCodes.PROTOCOL_ERROR)
    assert goaways(proxied.server, "settings") == 1


async def test_empty_data_frames_are_cut_past_ten_in_a_row(start_proxied: StartProxied, pki: PKI) -> None:
    proxied = await start_proxied()
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as flood:
        flood.send(
            flood.headers(1, "POST", THINGS, end_stream=False), *[DataFrame(1, b"")] * 10, DataFrame(1, b"{")
        )
        flood.send(*[DataFrame(1, b"")] * 10)
        await flood.round_trip()
        assert flood.goaway is None  # ten in a row are tolerated
        flood.send(*[DataFrame(1, b"")] * 11)
        await cut(flood, CALM)
    assert goaways(proxied.server, "empty_frames") == 1


async def test_streams_past_the_advertised_limit_end_the_connection(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """A client past SETTINGS_MAX_CONCURRENT_STREAMS breaks the protocol: libnghttp2 ends the
    connection (GOAWAY PROTOCOL_ERROR) where Go's server resets the one stream (docs/security.md);
    either way no handler beyond the limit runs."""
    proxied = await start_proxied(http2_max_streams_per_connection=10)
    held = Held()
    proxied.backend.routes[THINGS] = held
    async with RawH2.connect(proxied.server.port, pki.client_context("admin")) as client:
        await client.round_trip()  # our SETTINGS acknowledged: the limit is in force
        client.send(*[client.headers(sid, "GET", THINGS) for sid in range(1, 22, 2)])  # 11 streams
        await cut(client, ErrorCodes.PROTOCOL_ERROR)
        assert client.goaway is not None and client.goaway.last_stream_id == 19
    assert held.arrived <= 10
    assert goaways(proxied.server, "protocol_error") == 1


async def test_an_unauthenticated_clients_connection_ends_after_its_response(
    start_proxied: StartProxied, pki: PKI
) -> None:
    """UnauthenticatedHTTP2DOSMitigation: a caller without credentials gets one answer per
    connection (401, or its anonymous answer), then GOAWAY NO_ERROR and the close."""
    proxied = await start_proxied()
    port = proxied.server.port
    for path in ("/apis", "/livez"):
        async with H2Client.connect(port, pki.client_context(None)) as anonymous:
            answer = await anonymous.get(path)
            await anonymous.until(lambda: anonymous.goaway is not None)
            assert anonymous.goaway is not None
            assert (anonymous.goaway.last_stream_id, anonymous.goaway.error_code) == (1, ErrorCodes.NO_ERROR)
            await anonymous.until(lambda: anonymous.closed)
        assert answer.status == (401 if path == "/apis" else 200)
    async with H2Client.connect(port, pki.client_context("admin")) as admin:
        assert (await admin.get("/apis")).status == 200
        assert (await admin.get("/livez")).status == 200
        admin.ping()
        await admin.until(lambda: bool(admin.pings))
        assert admin.goaway is None and not admin.closed
    assert goaways(proxied.server, "unauthenticated") == 2
