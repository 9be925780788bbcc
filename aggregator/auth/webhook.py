"""POST a TokenReview or SubjectAccessReview to kube-apiserver with upstream's retry rules.

apiserver's webhook clients (`util/webhook.WithExponentialBackoff` + `DefaultShouldRetry`) retry a
review only when the failure says "try again": a reset connection, a 500 InternalError, a 504 or
Timeout, a 429, or an answer carrying Retry-After. Everything else (refused connection, 403 for a
gateway without RBAC to create reviews, a malformed answer) fails at once. Backoff: 0.5 s, x1.5,
20 % jitter, at most 5 attempts; the whole review, retries included, has one deadline (10 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import aiohttp

from aggregator.auth.metrics import AuthMetrics
from aggregator.kube.calls import ApiCall
from aggregator.kube.client import KubeError, KubeResponse, KubeUnreachable, describe_error
from aggregator.tracing.api import active_phase

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
# The span of each kind of review, inside its traced phase.
REVIEW_SPANS = {"tokenreview": "TokenReview", "subjectaccessreview": "SubjectAccessReview"}


class ReviewFailed(Exception):
    """The review could not be made: kube-apiserver unreachable, refused, or answered nonsense."""


class ReviewPoster(Protocol):
    """What a review needs from `KubeClient`: one JSON request, any status returned."""

    async def request(
        self,
        call: ApiCall,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> KubeResponse: ...


@dataclass(frozen=True)
class Backoff:
    """`wait.Backoff{Duration: 500ms, Factor: 1.5, Jitter: 0.2, Steps: 5}`."""

    initial: float = 0.5
    factor: float = 1.5
    jitter: float = 0.2
    steps: int = 5

    def delays(self) -> list[float]:
        """Sleeps between attempts (one fewer than `steps`)."""
        out: list[float] = []
        delay = self.initial
        for _ in range(max(self.steps - 1, 0)):
            out.append(delay + random.random() * self.jitter * delay if self.jitter > 0 else delay)
            delay *= self.factor
        return out


class _Attempt(Exception):
    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def _status_of(body: bytes) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None


def _should_retry(status: int, reason: str, headers: Mapping[str, str], details: Mapping[str, Any]) -> bool:
    """`DefaultShouldRetry` for an HTTP answer (client-go maps a bare 500 to InternalError, 504 to
    Timeout)."""
    if status == 429 or reason in ("InternalError", "Timeout", "ServerTimeout", "TooManyRequests"):
        return True
    if status in (500, 504) and not reason:
        return True
    retry_after = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
    if isinstance(retry_after, int) and retry_after > 0:
        return True
    return status >= 500 and any(name.lower() == "retry-after" for name in headers)


def _connection_reset(err: BaseException) -> bool:
    cause = err.__cause__
    return isinstance(cause, ConnectionResetError | aiohttp.ServerDisconnectedError)


@dataclass(eq=False)
class WebhookClient:
    """Creates one kind of review object; records `review_duration` and `reviews_in_flight`."""

    poster: ReviewPoster
    call: ApiCall
    _: KW_ONLY
    kind: str
    metrics: AuthMetrics
    timeout: float = DEFAULT_TIMEOUT
    backoff: Backoff = field(default_factory=Backoff)

    async def create(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The created review object (with its `status`), or ReviewFailed naming the last error."""
        in_flight = self.metrics.reviews_in_flight.labels(self.kind)
        in_flight.inc()
        try:
            async with asyncio.timeout(self.timeout):
                return await self._with_retries(body)
        except TimeoutError as err:
            raise ReviewFailed(f"{self.call}: no answer within {self.timeout:g}s") from err
        finally:
            in_flight.dec()

    async def _with_retries(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        delays = self.backoff.delays()
        attempt = 0
        while True:
            try:
                return await self._attempt(body)
            except _Attempt as failure:
                if not failure.retry or attempt >= len(delays):
                    raise ReviewFailed(str(failure)) from failure
                log.info(
                    "retrying a review",
                    extra={"fields": {"kind": self.kind, "attempt": attempt + 1, "reason": str(failure)}},
                )
                await asyncio.sleep(delays[attempt])
                attempt += 1

    async def _attempt(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        started = time.monotonic()
        # Tracing hook: inside a traced authentication or authorization phase, the review is its
        # client span, and kube-apiserver gets its traceparent (upstream wraps the webhook's
        # transport with `tracing.WrapperFor`).
        phase = active_phase()
        span = (
            phase.client(REVIEW_SPANS.get(self.kind, self.kind), method="POST", url=self.call.url_path())
            if phase is not None
            else None
        )
        try:
            response = await self.poster.request(
                self.call,
                json_body=body,
                headers=span.headers() if span is not None else None,
                client_timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        except KubeUnreachable as err:
            if span is not None:
                span.end(error=str(err))
            raise _Attempt(str(err), retry=_connection_reset(err)) from err
        except KubeError as err:
            if span is not None:
                span.end(error=str(err))
            raise _Attempt(str(err), retry=False) from err
        except Exception as err:  # credentials that cannot be loaded (bad kubeconfig, exec plugin...)
            if span is not None:
                span.end(error=describe_error(err))
            raise _Attempt(f"{self.call}: {describe_error(err)}", retry=False) from err
        finally:
            self.metrics.review_duration.labels(self.kind).observe(time.monotonic() - started)
        if span is not None:
            span.end(response.status)
        if not 200 <= response.status < 300:
            status = _status_of(response.body) or {}
            reason = str(status.get("reason", ""))
            message = str(status.get("message", "")) or response.body[:200].decode("utf-8", "replace")
            details = status.get("details") or {}
            summary = f"{self.call}: HTTP {response.status}{f' {reason}' if reason else ''}"
            raise _Attempt(
                f"{summary}: {message}" if message else summary,
                retry=_should_retry(response.status, reason, response.headers, details),
            )
        try:
            doc = json.loads(response.body)
        except (ValueError, UnicodeDecodeError) as err:
            raise _Attempt(f"{self.call}: response is not JSON: {err}", retry=False) from err
        if not isinstance(doc, dict):
            raise _Attempt(f"{self.call}: response is not an object", retry=False)
        return doc
