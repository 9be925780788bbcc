"""Authorization as callers meet it: SubjectAccessReviews counted at the fake kube-apiserver."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from tests.auth.conftest import GROUP_PREFIX, Reviewed, StartReviewed, add_test_routes
from tests.conftest import StartGateway
from tests.support.polling import until

FLUNDER = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders/foo"


def status_bytes(message: str, reason: str, code: int, details: str | None) -> bytes:
    text = json.dumps(message)
    tail = f',"details":{details}' if details is not None else ""
    return (
        f'{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":{text},'
        f'"reason":"{reason}"{tail},"code":{code}}}\n'
    ).encode()


async def burst(reviewed: Reviewed, path: str, n: int = 100, cert: str = "alice") -> list[int]:
    results = await asyncio.gather(*(reviewed.call(path, cert=cert) for _ in range(n)))
    return [status for status, _ in results]


async def wait_for_misses(reviewed: Reviewed, count: float, timeout: float = 10.0) -> None:
    await until(
        lambda: reviewed.metric("aggregator_authorization_cache_total", result="miss") >= count,
        timeout,
        f"{count:g} authorization cache misses",
    )


async def test_concurrent_identical_requests_make_one_review_then_the_cache_answers(
    start_reviewed: StartReviewed,
) -> None:
    ttl = 5.0  # long enough for the second burst to land inside it on a loaded machine
    # API Priority and Fairness runs before authorization: alice's level (global-default) must have a
    # seat for each of the 100 at once, or the ones past its seats wait in its queues, not for the review
    # (its nominal seats: 20/245 of both limits' sum, here 2200)
    reviewed = await start_reviewed(authorization_webhook_cache_authorized_ttl=ttl, max_requests_inflight=2000)
    reviewed.reviews.hold()
    first = asyncio.create_task(burst(reviewed, FLUNDER))
    await wait_for_misses(reviewed, 100)  # all 100 are waiting for the one review in flight
    await reviewed.reviews.wait_for_waiting(1)  # the review's task has started and reached the fake
    assert reviewed.metric("aggregator_webhook_reviews_in_flight", kind="subjectaccessreview") == 1
    reviewed.reviews.release()
    assert await first == [200] * 100
    reviewed_at = time.monotonic()
    assert len(reviewed.reviews.access_reviews) == 1

    assert await burst(reviewed, FLUNDER) == [200] * 100
    assert time.monotonic() - reviewed_at < ttl, "second burst must land inside the TTL for this test"
    assert len(reviewed.reviews.access_reviews) == 1
    assert reviewed.metric("aggregator_authorization_cache_total", result="hit") == 100

    # the TTL itself must pass for the cached answer to expire: time, not an event
    await asyncio.sleep(max(0.0, ttl + 0.05 - (time.monotonic() - reviewed_at)))
    assert await reviewed.call(FLUNDER) == (
        200,
        b'{"name":"alice","groups":["devs","system:authenticated"]}\n',
    )
    assert len(reviewed.reviews.access_reviews) == 2
    assert reviewed.metric("aggregator_webhook_reviews_in_flight", kind="subjectaccessreview") == 0
    assert (
        reviewed.metric("aggregator_webhook_review_duration_seconds_count", kind="subjectaccessreview") == 2
    )


async def test_denials_follow_the_unauthorized_ttl(start_reviewed: StartReviewed) -> None:
    ttl = 1.5  # long enough for the second call to land inside it on a loaded machine
    reviewed = await start_reviewed(
        authorization_webhook_cache_authorized_ttl=30.0, authorization_webhook_cache_unauthorized_ttl=ttl
    )
    reviewed.reviews.deny("bob")
    assert (await reviewed.call(FLUNDER, cert="alice"))[0] == 200
    assert (await reviewed.call(FLUNDER, cert="bob"))[0] == 403
    denied_at = time.monotonic()
    assert (await reviewed.call(FLUNDER, cert="bob"))[0] == 403
    assert time.monotonic() - denied_at < ttl, "the second call must land inside the TTL for this test"
    assert [s["user"] for s in reviewed.reviews.access_reviews] == ["alice", "bob"]
    # the TTL itself must pass for the cached denial to expire: time, not an event
    await asyncio.sleep(max(0.0, ttl + 0.05 - (time.monotonic() - denied_at)))
    assert (await reviewed.call(FLUNDER, cert="bob"))[0] == 403
    assert (await reviewed.call(FLUNDER, cert="alice"))[0] == 200  # allowed answers are still cached
    assert [s["user"] for s in reviewed.reviews.access_reviews] == ["alice", "bob", "bob"]


async def test_a_failed_review_is_a_500_and_is_not_cached(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.fail_with(
        403,
        "Forbidden",
        'subjectaccessreviews.authorization.k8s.io is forbidden: User "system:serviceaccount:aggregator:gateway" '
        'cannot create resource "subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope',
    )
    status, body = await reviewed.call(FLUNDER)
    assert status == 500
    assert body == status_bytes(
        f'Internal Server Error: "{FLUNDER}": create subjectaccessreviews.authorization.k8s.io: HTTP 403 Forbidden: '
        'subjectaccessreviews.authorization.k8s.io is forbidden: User "system:serviceaccount:aggregator:gateway" '
        'cannot create resource "subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope',
        "InternalError",
        500,
        None,
    )
    reviewed.reviews.recover()
    assert (await reviewed.call(FLUNDER))[0] == 200
    assert len(reviewed.reviews.access_reviews) == 2


async def test_exact_403_for_a_resource_request(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.deny("bob")
    assert await reviewed.call(FLUNDER, cert="bob") == (
        403,
        status_bytes(
            'flunders.wardle.example.com "foo" is forbidden: User "bob" cannot get resource "flunders" in API '
            'group "wardle.example.com" in the namespace "default"',
            "Forbidden",
            403,
            '{"name":"foo","group":"wardle.example.com","kind":"flunders"}',
        ),
    )
    cluster_list = f"{GROUP_PREFIX}v1alpha1/fischers/x/status"
    reviewed.reviews.deny(
        "bob", 'RBAC: clusterrole.rbac.authorization.k8s.io "viewer" not found', explicit=True
    )
    assert await reviewed.call(cluster_list, cert="bob", method="PUT") == (
        403,
        status_bytes(
            'fischers.wardle.example.com "x" is forbidden: User "bob" cannot update resource "fischers/status" in '
            'API group "wardle.example.com" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io '
            '"viewer" not found',
            "Forbidden",
            403,
            '{"name":"x","group":"wardle.example.com","kind":"fischers"}',
        ),
    )


async def test_exact_403_for_a_non_resource_request(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.deny("bob")
    assert await reviewed.call("/metrics", cert="bob") == (
        403,
        status_bytes('forbidden: User "bob" cannot get path "/metrics"', "Forbidden", 403, "{}"),
    )
    assert reviewed.reviews.access_reviews[-1]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}


async def test_review_carries_the_callers_identity_and_request_attributes(
    start_reviewed: StartReviewed,
) -> None:
    reviewed = await start_reviewed()
    path = (
        f"{GROUP_PREFIX}v1alpha1/namespaces/ns1/flunders?labelSelector=app%3Dweb,tier%20notin%20(db)&watch=1"
    )
    assert (await reviewed.call(path))[0] == 200
    spec = reviewed.reviews.access_reviews[-1]
    credential = spec["extra"]["authentication.kubernetes.io/credential-id"]
    assert len(credential) == 1 and credential[0].startswith("X509SHA256=")
    assert spec == {
        "resourceAttributes": {
            "namespace": "ns1",
            "verb": "watch",
            "group": "wardle.example.com",
            "version": "v1alpha1",
            "resource": "flunders",
            "labelSelector": {
                "requirements": [
                    {"key": "app", "operator": "In", "values": ["web"]},
                    {"key": "tier", "operator": "NotIn", "values": ["db"]},
                ]
            },
        },
        "user": "alice",
        "groups": ["devs", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/credential-id": credential},
    }
    # The wire bytes follow the Go struct order, as kube-apiserver's own clients send them.
    assert reviewed.reviews.bodies[-1].startswith(
        b'{"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","spec":{"resourceAttributes":'
        b'{"namespace":"ns1","verb":"watch","group":"wardle.example.com"'
    )


async def test_single_object_watch_is_reviewed_with_the_name(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    path = f"{GROUP_PREFIX}v1alpha1/namespaces/ns1/flunders?fieldSelector=metadata.name%3Dfoo&watch=true"
    assert (await reviewed.call(path))[0] == 200
    attributes = reviewed.reviews.access_reviews[-1]["resourceAttributes"]
    assert attributes["name"] == "foo"
    assert attributes["verb"] == "watch"
    assert attributes["fieldSelector"] == {
        "requirements": [{"key": "metadata.name", "operator": "In", "values": ["foo"]}]
    }


async def test_always_allowed_groups_and_paths_need_no_review(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.deny("system:anonymous")
    assert (await reviewed.call(FLUNDER, cert="admin"))[0] == 200  # system:masters
    assert await reviewed.call("/healthz", cert=None) == (200, b"ok")
    assert await reviewed.call("/readyz", cert="bob") == (200, b"ok")
    assert reviewed.reviews.access_reviews == []
    # only the exact paths: /healthz/ping is reviewed (and denied to anonymous here)
    status, _ = await reviewed.call("/healthz/ping", cert=None)
    assert status == 403
    assert reviewed.reviews.access_reviews == [
        {
            "nonResourceAttributes": {"path": "/healthz/ping", "verb": "get"},
            "user": "system:anonymous",
            "groups": ["system:unauthenticated"],
        }
    ]


async def test_custom_always_allow_paths_and_groups(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed(
        authorization_always_allow_paths=["/metrics", "/debug/*"], authorization_always_allow_groups=["devs"]
    )
    reviewed.reviews.deny("bob")
    assert (await reviewed.call("/metrics", cert="bob"))[0] == 200
    assert (await reviewed.call("/debug/pprof/x", cert="bob"))[0] == 404
    assert (await reviewed.call(FLUNDER, cert="alice"))[0] == 200  # alice is in devs
    assert (await reviewed.call("/healthz", cert="bob"))[0] == 403  # no longer in the list
    assert (await reviewed.call(f"{GROUP_PREFIX}v1/debug/x", cert="bob"))[0] == 403  # resource request
    assert [s["user"] for s in reviewed.reviews.access_reviews] == ["bob", "bob"]


async def test_requests_for_kube_apiserver_are_left_to_it(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    reviewed.reviews.deny("bob")
    assert (await reviewed.call("/delegated", cert="bob"))[0] == 200
    assert reviewed.reviews.access_reviews == []


async def test_oversized_requests_are_reviewed_every_time(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    path = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders/{'n' * 5000}"
    assert (await reviewed.call(path))[0] == 200
    assert (await reviewed.call(path))[0] == 200
    assert len(reviewed.reviews.access_reviews) == 2
    # the path counts too (upstream sums namespace, verb, group, ..., name and path): 2 x 4000 < 10000
    short = f"{GROUP_PREFIX}v1alpha1/namespaces/default/flunders/{'n' * 4000}"
    assert (await reviewed.call(short))[0] == 200
    assert (await reviewed.call(short))[0] == 200
    assert len(reviewed.reviews.access_reviews) == 3


async def test_bad_request_info_is_upstreams_500(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed()
    path = f"{GROUP_PREFIX}v1alpha1/watch"
    assert await reviewed.call(path) == (
        500,
        status_bytes(
            f'Internal Server Error: "{path}": failed to create RequestInfo: unable to determine kind and '
            f"namespace from url, {path}",
            "InternalError",
            500,
            None,
        ),
    )


async def test_local_mode_without_kubeconfig_allows_every_authenticated_caller_and_says_so(
    start_gateway: StartGateway, users: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.auth.build")
    server = await start_gateway()
    add_test_routes(server)
    assert any("NO RBAC MANIFESTS in --apiservices-dir" in r.getMessage() for r in caplog.records)
    assert (
        f"authorization: RBAC from {server.gateway.config.source.apiservices_dir}; without RBAC manifests: every "
        "authenticated caller, never impersonation"
    ) in server.gateway.auth_summary
    import aiohttp

    from tests.support.pki import PKI

    assert isinstance(users, PKI)
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + FLUNDER, ssl=users.client_context("bob")) as resp:
            assert resp.status == 200
        async with session.get(server.url + FLUNDER, ssl=users.client_context(None)) as resp:
            assert resp.status == 401  # still authenticated first


async def test_start_up_summary_names_the_review_source(start_reviewed: StartReviewed) -> None:
    reviewed = await start_reviewed(authorization_webhook_cache_unauthorized_ttl=3.0)
    summary = reviewed.server.gateway.auth_summary
    (line,) = [s for s in summary if s.startswith("authorization: ")]
    assert line.startswith("authorization: RBAC from ") and " (while it holds RBAC manifests), then " in line
    assert ", then SubjectAccessReview via " in line and line.endswith("(cached 10s allowed, 3s denied)")
    assert "bearer tokens (TokenReview, cached 10s)" in summary
