"""The pipeline's gates and handler, driven with in-memory requests: the order they run in, and
what a gate that must wait (a review) does to the gates after it."""

from __future__ import annotations

from collections.abc import Awaitable

from prometheus_client import CollectorRegistry

from aggregator.web.accesslog import AccessLog, AccessLogPolicy
from aggregator.web.context import RequestContext
from aggregator.web.longrunning import InFlight
from aggregator.web.metrics import Increments
from aggregator.web.pipeline import Gate, GateAnswer, Pipeline, PipelineMetrics
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.serverrequest import Response
from tests.support.contexts import RecordedRequest


def pipeline_with(gates: list[Gate], ran: list[str], registry: CollectorRegistry | None = None) -> Pipeline:
    async def handler(_ctx: RequestContext) -> Response:
        ran.append("handler")
        return Response(status=200, body=b"handled")

    return Pipeline(
        Router(Route(handler, RouteKind.OWN, "test")),
        Increments(PipelineMetrics(registry or CollectorRegistry()).requests),
        AccessLog(AccessLogPolicy.parse("off")),
        in_flight=InFlight(),
        gates=tuple(gates),
    )


def passing(name: str, ran: list[str]) -> Gate:
    def gate(_ctx: RequestContext) -> None:
        ran.append(name)

    return gate


def waiting(name: str, ran: list[str], answer: GateAnswer = None) -> Gate:
    """A gate that must wait (an authorization review) before it answers or lets the request on."""

    async def review() -> GateAnswer:
        ran.append(name)
        return answer

    def gate(_ctx: RequestContext) -> Awaitable[GateAnswer]:
        return review()

    return gate


def refusing(name: str, ran: list[str]) -> Gate:
    def gate(_ctx: RequestContext) -> Response:
        ran.append(name)
        return Response(status=403, body=b"refused by " + name.encode())

    return gate


async def serve(pipeline: Pipeline) -> RecordedRequest:
    request = RecordedRequest("GET", "/apis/example.com/v1/things")
    await pipeline.handle(request)
    return request


async def test_every_gate_runs_in_order_before_the_handler_whether_or_not_one_waits() -> None:
    ran: list[str] = []
    registry = CollectorRegistry()
    request = await serve(
        pipeline_with(
            [passing("a", ran), waiting("b", ran), passing("c", ran), waiting("d", ran)], ran, registry
        )
    )
    assert ran == ["a", "b", "c", "d", "handler"]
    assert request.body_written == b"handled"
    # Counted by the route's kind, labelled with its value.
    assert registry.get_sample_value("aggregator_requests_total", {"route": "own", "code": "200"}) == 1.0


async def test_a_gate_after_one_that_waited_can_still_refuse() -> None:
    ran: list[str] = []
    request = await serve(
        pipeline_with([waiting("review", ran), refusing("upgrade", ran), passing("x", ran)], ran)
    )
    assert ran == ["review", "upgrade"]
    assert request.answers[-1].status == 403 and request.body_written == b"refused by upgrade"


async def test_a_waiting_gates_answer_stops_the_request() -> None:
    ran: list[str] = []
    refusal = Response(status=403, body=b"denied")
    request = await serve(
        pipeline_with([passing("a", ran), waiting("review", ran, refusal), passing("b", ran)], ran)
    )
    assert ran == ["a", "review"]
    assert request.body_written == b"denied"
