"""Tracing end to end: a gateway with `--tracing-config-file`, an OTLP/gRPC receiver built on
opentelemetry-proto, a backend that records the `traceparent` it gets, and clients over HTTP/1.1
and HTTP/2. One trace shows client, gateway and backend: the gateway's server span is the child
of the caller's sampled span, its phases and its proxied call are children of it, and the
backend's parent is the proxied call's span.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from aggregator.tracing.otel import SERVICE_NAME
from tests.flowcontrol.client import PROTOCOLS, client
from tests.flowcontrol.support import flow_schema, priority_level
from tests.support.backend import (
    APISERVICE,
    GROUP,
    VERSION,
    BackendPKI,
    FakeBackend,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
    wait_available,
    write_manifests,
)
from tests.support.fixtures import Proxied, StartProxied
from tests.support.h2client import H2Client
from tests.support.holding import Held
from tests.support.otlp import (
    CLIENT,
    SERVER,
    STATUS_ERROR,
    new_parent,
    otlp_receiver,
    server_span,
    tracing_config,
)
from tests.support.pki import PKI
from tests.support.polling import until, until_async

PATH = f"/apis/{GROUP}/{VERSION}/namespaces/default/widgets/w1"
SPAN_NAME = f"GET /apis/{GROUP}/{VERSION}/namespaces/{{:namespace}}/widgets/{{:name}}"


async def get(proxied: Proxied, protocol: str, path: str, headers: dict[str, str]) -> int:
    if protocol == "HTTP/2":
        async with H2Client.connect(proxied.server.port, proxied.pki.client_context("admin")) as client:
            return (await client.response(client.request("GET", path, headers.items()))).status
    async with proxied.request("GET", path, headers=headers) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/2"])
async def test_a_sampled_caller_gateway_and_backend_share_one_trace(
    protocol: str, start_proxied: StartProxied, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(tracing_config_file=tracing_config(tmp_path, receiver))  # rate 0
        # No pooled connection from availability's or discovery's calls: this request dials.
        proxied.server.gateway.backends.retire_all()
        trace_id, caller, traceparent = new_parent()
        audit_id = "3f0c3a6e-54b1-4d4e-9d58-6a2b2b1f0d11"
        status = await get(proxied, protocol, PATH, {"traceparent": traceparent, "Audit-ID": audit_id})
        assert status == 200

        # The server span ends last: once it is exported, every span of the request was.
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None, what="the request's spans")
        server = server_span(receiver, trace_id)
        assert server is not None
        # The caller's span is the parent (ParentBased honours it, whatever the rate).
        assert server.parent_span_id == caller and server.name == SPAN_NAME
        assert server.attributes["http.method"] == "GET" and server.attributes["http.target"] == PATH
        assert server.attributes["http.flavor"] == ("2" if protocol == "HTTP/2" else "1.1")
        assert server.attributes["http.status_code"] == 200 and server.attributes["audit-id"] == audit_id
        assert server.resource["service.name"] == SERVICE_NAME
        children = {s.name: s for s in receiver.children(server)}
        assert {"authentication", "priority-and-fairness", "authorization", "HTTP GET"} <= children.keys(), children.keys()
        # the gates in kube-apiserver's order, one after the other
        gates = [children[name] for name in ("authentication", "priority-and-fairness", "authorization")]
        for before, after in itertools.pairwise(gates):
            assert before.end_ns <= after.start_ns, (before.name, after.name)
        call = children["HTTP GET"]
        assert call.kind == CLIENT and call.attributes["apiservice"] == APISERVICE
        assert call.attributes["endpoint"] == f"127.0.0.1:{proxied.backend.port}"
        assert call.event("first byte") == {"endpoint": call.attributes["endpoint"], "http.status_code": 200}
        # A new connection: its TCP connect and TLS handshake, in order, inside the call.
        phases = {s.name: s for s in receiver.children(call)}
        assert {"connect", "TLS handshake"} <= phases.keys(), phases.keys()
        assert call.start_ns <= phases["connect"].start_ns <= phases["connect"].end_ns
        assert phases["connect"].end_ns <= phases["TLS handshake"].start_ns <= phases["TLS handshake"].end_ns
        for child in (*gates, call):
            assert server.start_ns <= child.start_ns and child.end_ns <= server.end_ns
        # The backend's parent is the gateway's proxied call: client, gateway, backend in one trace.
        (seen,) = [r for r in proxied.backend.received if r.raw_path == PATH]
        assert seen.one("traceparent") == f"00-{trace_id}-{call.span_id}-01"


async def test_rate_zero_without_a_sampled_parent_exports_nothing_and_the_header_crosses(
    start_proxied: StartProxied, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(tracing_config_file=tracing_config(tmp_path, receiver, rate=0))
        _, _, unsampled = new_parent(sampled=False)
        assert await get(proxied, "HTTP/1.1", PATH + "?n=1", {"traceparent": unsampled}) == 200
        assert await get(proxied, "HTTP/1.1", PATH + "?n=2", {}) == 200
        # A sampled request after them: once its spans are exported, theirs would have been too.
        trace_id, _, sampled = new_parent()
        assert await get(proxied, "HTTP/1.1", PATH + "?n=3", {"traceparent": sampled}) == 200
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None)
        assert {s.trace_id for s in receiver.spans} == {trace_id}
        # Not sampled: the caller's header reaches the backend untouched; none was made up.
        by_path = {r.raw_path: r for r in proxied.backend.received}
        assert by_path[PATH + "?n=1"].one("traceparent") == unsampled
        assert by_path[PATH + "?n=2"].one("traceparent") is None


async def test_a_rate_of_one_million_samples_requests_without_a_parent(
    start_proxied: StartProxied, tmp_path: Path, pki: PKI
) -> None:
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(tracing_config_file=tracing_config(tmp_path, receiver, rate=1_000_000))
        assert await get(proxied, "HTTP/1.1", "/apis/nothing.example.com/v1/things", {}) == 404
        await receiver.wait_for(lambda spans: any(s.kind == SERVER for s in spans))
        (server,) = [s for s in receiver.spans if s.kind == SERVER]
        assert server.parent_span_id == "" and server.attributes["http.status_code"] == 404
        # Not a resource of a known group: upstream names the span by the method alone... unless
        # RequestInfo says it is a resource request, as this path is.
        assert server.name == "GET /apis/nothing.example.com/v1/things"


async def test_a_backend_that_cannot_be_reached_marks_the_call_failed(
    start_proxied: StartProxied, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(tracing_config_file=tracing_config(tmp_path, receiver), force=True)
        await proxied.backend.stop()
        trace_id, _, traceparent = new_parent()
        assert await get(proxied, "HTTP/1.1", PATH, {"traceparent": traceparent}) == 503
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None)
        server = server_span(receiver, trace_id)
        assert server is not None and server.status_code == STATUS_ERROR
        (call,) = [s for s in receiver.children(server) if s.name == "HTTP GET"]
        assert call.status_code == STATUS_ERROR and call.attributes["hop"] == "connect"
        # Never written: retried once on the same address (the only one), and said so.
        retry = call.event("retry")
        assert retry is not None and retry["reason"] == "unsent" and "connection refused" in retry["cause"]


async def test_a_dead_replica_is_an_ejection_and_a_retry_in_the_call_that_met_it(
    start_proxied: StartProxied, backend: FakeBackend, backend_pki: BackendPKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    """Two ready endpoints, one dead (nothing listens on 127.0.0.2): the request that picks it is
    refused there, ejects it and is retried on the live one, all in its proxied call's span."""
    write_manifests(
        apiservices_dir,
        "demo",
        apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem),
        service_manifest(port=backend.port),
        endpointslice_manifest("api-1", [("127.0.0.1", True), ("127.0.0.2", True)], port=backend.port),
    )
    dead, live = f"127.0.0.2:{backend.port}", f"127.0.0.1:{backend.port}"
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(
            manifests=False, tracing_config_file=tracing_config(tmp_path, receiver), enable_aggregator_routing=True
        )
        await wait_available(proxied.server)

        async def a_request_met_the_dead_replica() -> bool:
            trace_id, _, traceparent = new_parent()
            assert await get(proxied, "HTTP/1.1", PATH, {"traceparent": traceparent}) == 200
            await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None)
            return any(s.event("retry") is not None for s in receiver.named("HTTP GET"))

        await until_async(a_request_met_the_dead_replica, timeout=30, what="a request balanced to the dead replica")
        (call,) = [s for s in receiver.named("HTTP GET") if s.event("retry") is not None]
        retry, ejection = call.event("retry"), call.event("ejection")
        assert retry is not None and (retry["endpoint"], retry["reason"]) == (dead, "unsent")
        assert ejection is not None and ejection["endpoint"] == dead and "connection refused" in ejection["reason"]
        assert call.attributes["endpoint"] == live and call.event("first byte") == {"endpoint": live, "http.status_code": 200}
        # Ejected: the next request goes to the live one at once.
        trace_id, _, traceparent = new_parent()
        assert await get(proxied, "HTTP/1.1", PATH, {"traceparent": traceparent}) == 200
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None)
        (after,) = [s for s in receiver.named("HTTP GET") if s.trace_id == trace_id]
        assert after.attributes["endpoint"] == live and after.event("retry") is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_priority_and_fairness_is_a_phase_that_lasts_a_queued_requests_wait_and_ends_with_its_429(
    protocol: str, start_proxied: StartProxied, apiservices_dir: Path, pki: PKI, tmp_path: Path
) -> None:
    """One seat in all, alice's: her second GET waits in a queue for the first to finish, her third
    is refused once the level rejects instead of queuing."""
    alice = pki.issue_user("alice", "alice", ())
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/widgets"

    def config(queues: int | None) -> None:
        write_manifests(
            apiservices_dir,
            "apf",
            priority_level("tenants", shares=10, lendable=0, borrowing=0, queues=queues),
            flow_schema("tenants", "tenants", users=("alice",)),
        )

    config(queues=16)
    async with otlp_receiver() as receiver:
        proxied = await start_proxied(
            tracing_config_file=tracing_config(tmp_path, receiver),
            max_requests_inflight=1,
            max_mutating_requests_inflight=0,
        )
        held = Held()
        proxied.backend.routes[path] = held
        registry = proxied.server.gateway.metrics.registry
        waiting = {"priority_level": "tenants", "flow_schema": "tenants"}
        async with client(pki, proxied.server.port, protocol, alice) as as_alice:
            first = asyncio.create_task(as_alice.request("GET", path))
            await until(lambda: held.arrived == 1, what="the first GET at the backend")
            trace_id, _caller, traceparent = new_parent()
            queued = asyncio.create_task(as_alice.request("GET", path, {"traceparent": traceparent}))
            await until(
                lambda: registry.get_sample_value("apiserver_flowcontrol_current_inqueue_requests", waiting) == 1,
                what="the traced GET in its queue",
            )
            released_ns = time.time_ns()
            held.release.set()
            assert [(await first).status, (await queued).status] == [200, 200]
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None, what="the queued GET's spans")
        server = server_span(receiver, trace_id)
        assert server is not None
        children = {span.name: span for span in receiver.children(server)}
        phase = children["priority-and-fairness"]
        assert phase.start_ns < released_ns < phase.end_ns <= children["authorization"].start_ns
        assert phase.status_code != STATUS_ERROR

        # The level rejects past its seat: the refusal ends the phase, and the request, with 429.
        config(queues=None)
        flowcontrol = proxied.server.gateway.flowcontrol
        assert flowcontrol is not None
        await until(
            lambda: not flowcontrol.controller.levels["tenants"].queued, what="tenants rejecting instead of queuing"
        )
        held.release.clear()
        async with client(pki, proxied.server.port, protocol, alice) as as_alice:
            first = asyncio.create_task(as_alice.request("GET", path))
            await until(lambda: held.arrived == 3, what="another GET at the backend")
            trace_id, _caller, traceparent = new_parent()
            refused = await as_alice.request("GET", path, {"traceparent": traceparent})
            assert refused.status == 429
            held.release.set()
            assert (await first).status == 200
        await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None, what="the refused GET's spans")
        server = server_span(receiver, trace_id)
        assert server is not None and server.attributes["http.status_code"] == 429
        children = {span.name: span for span in receiver.children(server)}
        phase = children["priority-and-fairness"]
        assert phase.attributes["http.status_code"] == 429 and phase.status_code == STATUS_ERROR
        assert "authorization" not in children  # refused before authorization
