"""Bearer tokens checked by kube-apiserver (TokenReview), cached like apiserver's token cache.

Upstream (`token/cache/cached_token_authenticator.go`, `plugin/.../token/webhook`): the cache key
is an HMAC-SHA256 of the token under a random per-process key, so the token itself is never kept;
answers (authenticated or not) live `--authentication-token-webhook-cache-ttl` (10 s, 0 disables);
a failed review, or a review whose status carries an `error`, is never cached; identical concurrent
reviews share one call. A hit returns the user without awaiting anything.

Audiences (`--api-audiences`, webhook.go `AuthenticateToken`): when set they go in
`spec.audiences`, and the answer must name at least one of them in `status.audiences` (an answer
without audiences is taken as valid for the API audiences, upstream's implicit audiences). No
overlap is "not authenticated", decided before `status.authenticated` and cached like any other
answer. The audiences are part of the cache key (`keyFunc`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.auth.authn import AuthenticationError
from aggregator.auth.cache import MISSING, CoalescingCache
from aggregator.auth.metrics import AuthMetrics
from aggregator.auth.webhook import ReviewFailed, WebhookClient
from aggregator.model.userinfo import UserInfo
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

KIND = "tokenreview"
# Upstream's token cache is unbounded; one entry per distinct token seen in the TTL is bounded here.
MAX_ENTRIES = 16384


@dataclass(frozen=True, slots=True)
class TokenVerdict:
    """A TokenReview answer worth caching: the user, or None when the token was not authenticated."""

    user: UserInfo | None


def user_from_status(status: Mapping[str, Any]) -> UserInfo:
    raw = status.get("user") or {}
    extra = raw.get("extra") or {}
    return UserInfo(
        str(raw.get("username", "")),
        str(raw.get("uid", "")),
        tuple(str(g) for g in raw.get("groups") or ()),
        {str(k): tuple(str(v) for v in values or ()) for k, values in extra.items()},
    )


class TokenReviewAuthenticator:
    """`TokenAuthenticator` backed by TokenReview."""

    def __init__(
        self,
        webhook: WebhookClient,
        *,
        ttl: float,
        metrics: AuthMetrics,
        audiences: tuple[str, ...] = (),
        maxsize: int = MAX_ENTRIES,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.webhook = webhook
        self.ttl = ttl
        self.metrics = metrics
        self.audiences = audiences
        self._hmac_key = os.urandom(32)
        self._hits = metrics.authn_cache.labels("hit")
        self._misses = metrics.authn_cache.labels("miss")
        self._cache: CoalescingCache[bytes, TokenVerdict] = CoalescingCache(
            ttl_for=lambda _verdict: ttl, maxsize=maxsize, timer=timer
        )

    def cache_key(self, token: str) -> bytes:
        """HMAC-SHA256 over length-prefixed token and audiences, as upstream's `keyFunc`."""
        mac = hmac.new(self._hmac_key, digestmod=hashlib.sha256)
        encoded = token.encode("utf-8", "surrogateescape")
        mac.update(struct.pack(">I", len(encoded)))
        mac.update(encoded)
        mac.update(struct.pack(">I", len(self.audiences)))
        for audience in self.audiences:
            raw = audience.encode()
            mac.update(struct.pack(">I", len(raw)))
            mac.update(raw)
        return mac.digest()

    def cached_keys(self) -> list[bytes]:
        return self._cache.keys()

    def authenticate_token(self, token: str) -> UserInfo | Awaitable[UserInfo | None] | None:
        key = self.cache_key(token)
        cached = self._cache.get(key)
        if cached is not MISSING:
            self._hits.inc()
            assert isinstance(cached, TokenVerdict)
            return cached.user
        self._misses.inc()
        return self._authenticate(key, token)

    async def _authenticate(self, key: bytes, token: str) -> UserInfo | None:
        try:
            verdict = await self._cache.fetch(key, lambda: self._review(token))
        except ReviewFailed as err:
            raise AuthenticationError(f"token review failed: {err}") from err
        return verdict.user

    async def _review(self, token: str) -> TokenVerdict:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        review = await self.webhook.create(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        )
        status = review.get("status") or {}
        if self.audiences and not self._audiences_accepted(status):
            return TokenVerdict(None)
        if not status.get("authenticated"):
            error = str(status.get("error") or "")
            if error:
                # Not cached, as upstream: an `error` may be transient (an unreachable issuer...).
                raise AuthenticationError(error)
            return TokenVerdict(None)
        return TokenVerdict(user_from_status(status))

    def _audiences_accepted(self, status: Mapping[str, Any]) -> bool:
        """`wantAuds.Intersect(gotAuds)` is not empty; gotAuds defaults to the API audiences."""
        got = [str(a) for a in status.get("audiences") or ()]
        if not got or any(a in got for a in self.audiences):
            return True
        log.info(
            "token rejected: TokenReview names none of the API audiences",
            extra=fields(audiences=",".join(got), api_audiences=",".join(self.audiences)),
        )
        return False
