"""Tracing in the shipped configuration: `aggregator serve` in kube mode with `--workers 2` (and 1),
in front of the fake kube-apiserver and the sample wardle server.

A bearer token is checked with a TokenReview and the request authorized with a
SubjectAccessReview: each is a client span inside its phase, and kube-apiserver receives a
`traceparent` naming it. A delegated request (`/api/v1/...`) reaches kube-apiserver with the
gateway's proxied call as parent. Each worker exports its own spans (`process.pid`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kubestack import WARDLE_ADMINS, KubeStack
from tests.support.otlp import (
    CLIENT,
    SERVER,
    ReceivedSpan,
    Receiver,
    new_parent,
    otlp_receiver,
    server_span,
    tracing_config,
)
from tests.support.pki import PKI
from tests.support.polling import until_async

FLUNDERS = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
TOKEN = "tracing-test-token"


def child(receiver: Receiver, parent: ReceivedSpan, name: str) -> ReceivedSpan:
    (found,) = [s for s in receiver.children(parent) if s.name == name]
    return found


@pytest.mark.parametrize("workers", [2, 1])
async def test_reviews_and_the_delegate_are_in_the_callers_trace(
    workers: int, pki: PKI, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        args = ["--tracing-config-file", tracing_config(tmp_path, receiver)]
        async with KubeStack(pki, tmp_path, workers=workers, gateway_args=args) as stack:
            assert stack.reviews is not None
            stack.reviews.add_user(TOKEN, "tracer", groups=(WARDLE_ADMINS,))
            await stack.start_gateway()

            trace_id, caller, traceparent = new_parent()
            status, body = await stack.get(FLUNDERS, token=TOKEN, headers={"traceparent": traceparent})
            assert status == 200, body
            # The server span ends last: once it is exported, every span of the request was.
            await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None, what="the request's spans")
            server = server_span(receiver, trace_id)
            assert server is not None and server.parent_span_id == caller
            token_review = child(receiver, child(receiver, server, "authentication"), "TokenReview")
            access_review = child(receiver, child(receiver, server, "authorization"), "SubjectAccessReview")
            assert token_review.kind == CLIENT and token_review.attributes["http.status_code"] == 201
            assert access_review.attributes["http.url"] == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
            # kube-apiserver was told which span each review is.
            sent = {(r.path, r.traceparent) for r in stack.kube.requests if r.method == "POST"}
            assert ("/apis/authentication.k8s.io/v1/tokenreviews", f"00-{trace_id}-{token_review.span_id}-01") in sent
            assert (
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                f"00-{trace_id}-{access_review.span_id}-01",
            ) in sent
            assert child(receiver, server, "HTTP GET").attributes["apiservice"] == "v1beta1.wardle.example.com"

            # Delegated to kube-apiserver: its parent is the gateway's proxied call.
            trace_id, _, traceparent = new_parent()
            status, body = await stack.get(CONFIGMAPS, headers={"traceparent": traceparent})
            assert status == 200, body
            await receiver.wait_for(lambda _: server_span(receiver, trace_id) is not None)
            server = server_span(receiver, trace_id)
            assert server is not None
            call = child(receiver, server, "HTTP GET")
            (seen,) = [r for r in stack.kube.requests if r.path == CONFIGMAPS]
            assert seen.traceparent == f"00-{trace_id}-{call.span_id}-01"

            if workers == 2:
                # Fresh connections reach both workers; each exports its own spans.
                async def both_workers_exported() -> bool:
                    _, _, sampled = new_parent()
                    await stack.get("/version", headers={"traceparent": sampled})
                    pids = {s.resource["process.pid"] for s in receiver.spans if s.kind == SERVER}
                    return len(pids) == 2

                await until_async(both_workers_exported, timeout=30, what="spans from both workers")
