"""Authorization logic without sockets: decisions, the review spec, retries, and hits that never await."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from aggregator.audit.recorder import AUTHORIZATION_DECISION
from aggregator.auth.authz import (
    AlwaysAllowPaths,
    Authorizer,
    ReviewStatus,
    SubjectAccessReviewer,
    WebhookMode,
    spec_document,
    spec_key,
    verdict_from_status,
)
from aggregator.auth.metrics import AuthMetrics
from aggregator.auth.verdict import Decision, Verdict
from aggregator.auth.webhook import Backoff, ReviewFailed, WebhookClient
from aggregator.kube import calls
from aggregator.kube.calls import ApiCall
from aggregator.kube.client import KubeResponse, KubeUnreachable
from aggregator.model.userinfo import UserInfo
from aggregator.web.requestinfo import RequestInfo, new_request_info
from aggregator.wire.gourl import parse_query
from tests.support.contexts import context_for
from tests.support.polling import until

ALICE = UserInfo("alice", "u1", ("devs", "system:authenticated"), {"scopes": ("b", "a"), "aa": ("x",)})
Step = KubeResponse | BaseException


def info(method: str, url: str) -> RequestInfo:
    path, _, query = url.partition("?")
    return new_request_info(method, path, parse_query(query))


class ScriptedPoster:
    """Answers each request with the next scripted step (the last one repeats)."""

    def __init__(self, *steps: Step, on_call: Callable[[], None] | None = None) -> None:
        self.steps = list(steps)
        self.bodies: list[Any] = []
        self.on_call = on_call

    async def request(
        self,
        call: ApiCall,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> KubeResponse:
        self.bodies.append(json_body)
        if self.on_call is not None:
            self.on_call()
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, BaseException):
            raise step
        return step


def answer(status: int, doc: dict[str, Any], headers: dict[str, str] | None = None) -> KubeResponse:
    return KubeResponse(status, headers or {}, json.dumps(doc).encode())


def kube_status(code: int, reason: str, **extra: Any) -> KubeResponse:
    return answer(
        code,
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, **extra},
    )


def allowed(value: bool = True) -> KubeResponse:
    return answer(201, {"kind": "SubjectAccessReview", "status": {"allowed": value}})


def in_flight(metrics: AuthMetrics) -> float:
    """`aggregator_webhook_reviews_in_flight{kind="subjectaccessreview"}`."""
    value: float = metrics.reviews_in_flight.labels("subjectaccessreview")._value.get()
    return value


def webhook(poster: ScriptedPoster, **kwargs: Any) -> WebhookClient:
    return WebhookClient(
        poster,
        calls.CREATE_SUBJECTACCESSREVIEWS,
        kind="subjectaccessreview",
        metrics=AuthMetrics(CollectorRegistry()),
        backoff=Backoff(initial=0.001, factor=1.5, jitter=0.2, steps=5),
        **kwargs,
    )


# --- decisions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (ReviewStatus(True), Verdict(Decision.ALLOW)),
        (ReviewStatus(False, reason="no"), Verdict(Decision.NO_OPINION, "no")),
        (ReviewStatus(False, True, "nope"), Verdict(Decision.DENY, "nope")),
        (
            ReviewStatus(True, True),
            Verdict(Decision.DENY, "", "webhook subject access review returned both allow and deny response"),
        ),
    ],
)
def test_verdict_from_review_status(status: ReviewStatus, verdict: Verdict) -> None:
    assert verdict_from_status(status) == verdict


@pytest.mark.parametrize(
    ("entries", "path", "allowed"),
    [
        (["/healthz", "/readyz", "/livez"], "/healthz", True),
        (["/healthz", "/readyz", "/livez"], "/healthz/etcd", False),
        (["/healthz", "/readyz", "/livez"], "healthz", True),
        (["healthz"], "/healthz", True),
        (["/debug/*"], "/debug/pprof", True),
        (["/debug/*"], "/debug", False),
        (["/*"], "/anything/at/all", True),
        (["/"], "/", True),
        (["/"], "/x", False),
        ([], "/healthz", False),
    ],
)
def test_always_allow_paths(entries: list[str], path: str, allowed: bool) -> None:
    assert AlwaysAllowPaths(entries).allows(info("GET", path)) is allowed


def test_always_allow_paths_never_allow_resource_requests_and_reject_inner_stars() -> None:
    assert not AlwaysAllowPaths(["/*"]).allows(info("GET", "/api/v1/pods"))
    with pytest.raises(ValueError, match="only trailing"):
        AlwaysAllowPaths(["/a*b"])


# --- the spec ----------------------------------------------------------------------------------------


def test_resource_spec_in_go_field_order_with_selectors() -> None:
    request = info(
        "GET",
        "/apis/g.io/v1/namespaces/ns/things?fieldSelector=spec.x%3D1,a!%3Db&labelSelector=k>3,!gone,env%20in%20(b,a)",
    )
    spec = spec_document(spec_key(ALICE, request))
    assert json.dumps(spec, separators=(",", ":")) == (
        '{"resourceAttributes":{"namespace":"ns","verb":"list","group":"g.io","version":"v1","resource":"things",'
        '"fieldSelector":{"requirements":[{"key":"a","operator":"NotIn","values":["b"]},'
        '{"key":"spec.x","operator":"In","values":["1"]}]},'
        '"labelSelector":{"requirements":[{"key":"env","operator":"In","values":["a","b"]},'
        '{"key":"gone","operator":"DoesNotExist"}]}},'
        '"user":"alice","groups":["devs","system:authenticated"],'
        '"extra":{"aa":["x"],"scopes":["b","a"]},"uid":"u1"}'
    )


def test_unparsable_selectors_are_left_out_of_the_review() -> None:
    spec = spec_document(
        spec_key(UserInfo("bob"), info("GET", "/api/v1/pods?fieldSelector=x&labelSelector=%3D%3D"))
    )
    assert spec == {
        "resourceAttributes": {"verb": "list", "version": "v1", "resource": "pods"},
        "user": "bob",
    }


def test_non_resource_spec() -> None:
    assert spec_document(spec_key(UserInfo("bob"), info("POST", "/logs/x"))) == {
        "nonResourceAttributes": {"path": "/logs/x", "verb": "post"},
        "user": "bob",
    }


def test_equal_requests_share_a_key_and_different_ones_do_not() -> None:
    a = spec_key(ALICE, info("GET", "/api/v1/namespaces/a/pods"))
    assert a == spec_key(ALICE, info("GET", "/api/v1/namespaces/a/pods?pretty=1"))
    assert a != spec_key(ALICE, info("GET", "/api/v1/namespaces/b/pods"))
    assert a != spec_key(
        UserInfo("alice", "u1", ("devs",), ALICE.extra), info("GET", "/api/v1/namespaces/a/pods")
    )
    hash(a)


# --- hits never await --------------------------------------------------------------------------------


async def test_a_cache_hit_completes_without_suspending() -> None:
    poster = ScriptedPoster(allowed())
    reviewer = SubjectAccessReviewer(webhook(poster), allowed_ttl=10, denied_ttl=10, metrics=AuthMetrics(CollectorRegistry()))
    authorizer = Authorizer(always_allow_groups=(), always_allow_paths=(), modes=[WebhookMode(reviewer)])
    path = "/apis/g/v1/things"

    # a miss suspends: it waits for kube-apiserver (the review goes on without this caller)
    miss = authorizer.gate(context_for("GET", path, user=ALICE))
    assert inspect.iscoroutine(miss)
    assert miss.send(None) is not None
    miss.close()
    await until(
        lambda: poster.bodies and not in_flight(reviewer.metrics),
        5,
        "the review posted and answered",
        every=0.001,
    )
    await asyncio.sleep(0)  # one loop turn for the done-callbacks of the review's task

    # a hit is answered by the gate itself: nothing to await at all
    ctx = context_for("GET", path, user=ALICE)
    assert authorizer.gate(ctx) is None
    assert AUTHORIZATION_DECISION.get(ctx) == (True, "")
    assert len(poster.bodies) == 1


# --- retries (DefaultShouldRetry) --------------------------------------------------------------------


async def test_retryable_answers_are_retried() -> None:
    poster = ScriptedPoster(
        kube_status(500, "InternalError"), kube_status(429, "TooManyRequests"), answer(504, {}), allowed()
    )
    doc = await webhook(poster).create({"spec": {}})
    assert doc["status"] == {"allowed": True}
    assert len(poster.bodies) == 4


async def test_retry_after_is_a_reason_to_retry() -> None:
    poster = ScriptedPoster(answer(503, {}, {"retry-after": "1"}), allowed())
    await webhook(poster).create({})
    assert len(poster.bodies) == 2


@pytest.mark.parametrize(
    "step",
    [
        kube_status(403, "Forbidden", message="cannot create subjectaccessreviews"),
        kube_status(503, "ServiceUnavailable"),
        kube_status(400, "BadRequest"),
        answer(201, {"status": "not an object"}),
        KubeUnreachable(
            "create subjectaccessreviews.authorization.k8s.io: cannot connect: Connection refused"
        ),
        FileNotFoundError(2, "No such file or directory"),  # e.g. a kubeconfig that went away
    ],
)
async def test_other_failures_are_not_retried(step: Step) -> None:
    poster = ScriptedPoster(step)
    reviewer = SubjectAccessReviewer(webhook(poster), allowed_ttl=10, denied_ttl=10, metrics=AuthMetrics(CollectorRegistry()))
    with pytest.raises(ReviewFailed):
        await reviewer.review(spec_key(ALICE, info("GET", "/api/v1/pods")))
    assert len(poster.bodies) == 1


async def test_reset_connections_are_retried_up_to_five_attempts() -> None:
    reset = KubeUnreachable("create subjectaccessreviews.authorization.k8s.io: connection reset")
    reset.__cause__ = ConnectionResetError()
    poster = ScriptedPoster(reset)
    with pytest.raises(ReviewFailed, match="connection reset"):
        await webhook(poster).create({})
    assert len(poster.bodies) == 5


async def test_the_whole_review_has_one_deadline() -> None:
    poster = ScriptedPoster(kube_status(500, "InternalError"))
    client = WebhookClient(
        poster,
        calls.CREATE_SUBJECTACCESSREVIEWS,
        kind="subjectaccessreview",
        metrics=AuthMetrics(CollectorRegistry()),
        timeout=0.8,  # attempts at 0 and 0.5 s, the third (1 s) past the deadline: room for a loaded machine
        backoff=Backoff(initial=0.5, factor=1.0, jitter=0.0, steps=5),
    )
    with pytest.raises(ReviewFailed, match=r"no answer within 0.8s"):
        await client.create({})
    assert len(poster.bodies) == 2
    assert in_flight(client.metrics) == 0
