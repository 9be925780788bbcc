"""TokenReview and SubjectAccessReview endpoints for the fake kube-apiserver (via its `add_route`).

Tests set who a token is (`tokens`), which tokens fail with a status `error` (`token_errors`), and
what a SubjectAccessReview answers (`policy`, default: allow everything), then count what the
gateway sent (`token_reviews`, `access_reviews`: the specs, in order). `hold()` parks every review
until `release()`, so a burst of requests is provably concurrent; `fail_with(status, reason)` makes
reviews fail until `recover()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.support.fakekube import FakeKube, status_response
from tests.support.polling import until

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Spec = dict[str, Any]
# spec -> SubjectAccessReview status ({"allowed": bool, "denied"?: bool, "reason"?: str})
Policy = Callable[[Spec], dict[str, Any]]


def allow_all(_spec: Spec) -> dict[str, Any]:
    return {"allowed": True}


class FakeReviews:
    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.tokens: dict[str, dict[str, Any]] = {}
        self.token_errors: dict[str, str] = {}
        self.token_audiences: dict[str, list[str]] = {}
        self.policy: Policy = allow_all
        self.token_reviews: list[Spec] = []
        self.access_reviews: list[Spec] = []
        self.bodies: list[bytes] = []
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0
        self._failure: tuple[int, str, str] | None = None
        fake.add_route("POST", TOKENREVIEWS, self._token_review)
        fake.add_route("POST", SUBJECTACCESSREVIEWS, self._access_review)

    # --- knobs ---------------------------------------------------------------------------------------

    def add_user(
        self,
        token: str,
        username: str,
        *,
        uid: str = "",
        groups: tuple[str, ...] = (),
        extra: dict[str, list[str]] | None = None,
        audiences: list[str] | None = None,
    ) -> None:
        """`audiences`: what the answer's `status.audiences` names (None: no audiences in the answer)."""
        user: dict[str, Any] = {"username": username}
        if uid:
            user["uid"] = uid
        if groups:
            user["groups"] = list(groups)
        if extra:
            user["extra"] = extra
        self.tokens[token] = user
        if audiences is not None:
            self.token_audiences[token] = audiences

    def deny(self, user: str, reason: str = "", *, explicit: bool = False) -> None:
        """Everyone else stays allowed; `user` gets allowed=false (and denied=true if explicit)."""

        def policy(spec: Spec) -> dict[str, Any]:
            if spec.get("user") != user:
                return {"allowed": True}
            answer: dict[str, Any] = {"allowed": False}
            if explicit:
                answer["denied"] = True
            if reason:
                answer["reason"] = reason
            return answer

        self.policy = policy

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def wait_for_waiting(self, count: int = 1, timeout: float = 10.0) -> None:
        await until(lambda: self.waiting >= count, timeout, f"{count} held reviews", every=0.005)

    def fail_with(self, status: int, reason: str, message: str = "injected failure") -> None:
        self._failure = (status, reason, message)

    def recover(self) -> None:
        self._failure = None

    # --- handlers ------------------------------------------------------------------------------------

    async def _gate(self, request: web.Request) -> tuple[Spec, web.Response | None]:
        raw = await request.read()
        self.bodies.append(raw)
        body = await request.json()
        spec: Spec = body.get("spec", {})
        self.waiting += 1
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1
        if self._failure is not None:
            status, reason, message = self._failure
            return spec, status_response(status, reason, message)
        return spec, None

    async def _token_review(self, request: web.Request) -> web.StreamResponse:
        spec, failure = await self._gate(request)
        self.token_reviews.append(spec)
        if failure is not None:
            return failure
        token = spec.get("token", "")
        status: dict[str, Any]
        if token in self.tokens:
            status = {"authenticated": True, "user": self.tokens[token]}
        elif token in self.token_errors:
            status = {"authenticated": False, "error": self.token_errors[token]}
        else:
            status = {"authenticated": False}
        if token in self.token_audiences:
            status["audiences"] = self.token_audiences[token]
        return web.json_response(
            {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1", "spec": spec, "status": status},
            status=201,
        )

    async def _access_review(self, request: web.Request) -> web.StreamResponse:
        spec, failure = await self._gate(request)
        self.access_reviews.append(spec)
        if failure is not None:
            return failure
        return web.json_response(
            {
                "kind": "SubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "spec": spec,
                "status": self.policy(spec),
            },
            status=201,
        )
