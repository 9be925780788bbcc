"""Kube mode: kube-apiserver's first OpenAPI download, retried fast and awaited by `/readyz`.

Until kube-apiserver's `/openapi/v3` index, the documents it lists and `/openapi/v2` have been
downloaded once (and v2 merged), `kubectl explain` of a built-in type through the gateway fails
with `couldn't find resource for "apps/v1, Resource=deployments"`. So, in kube mode:

- a failed first download is retried after at most `retry` seconds (1 s), not on the source's
  exponential backoff, which after a few failures at start waits longer than kube-apiserver takes
  to settle;
- the readiness check `kube-apiserver-openapi` fails until that download is in, so a load balancer
  sends no kubectl to a gateway that cannot explain yet.

Both stop after `bound` seconds (30 s) from the first attempt: the check passes and retries go back
to the backoff. 30 s is the download timeout, so one hung attempt fits, and longer than
kube-apiserver needs to settle (its hashes move for a few seconds after a start). Past that,
kube-apiserver is failing in a way a retry will not fix soon (RBAC refusing `/openapi/v3`, an
overloaded server), and OpenAPI only serves `kubectl explain` and client-side validation: a gateway
that proxies and lists every aggregated API must not stay out of its Service, and a rollout must
not stall, for that. A source that answers 404 (no OpenAPI v3, or no v2) has answered: that is
ready at once. kube-apiserver's own readiness does not wait for its OpenAPI controllers either;
this check exists because the gateway, unlike kube-apiserver, downloads its built-in documents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aggregator.openapi.sources import OpenAPISource
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

CHECK_NAME = "kube-apiserver-openapi"


@dataclass
class FirstDownload:
    """The first-download policy for one source (kube-apiserver)."""

    bound: float = 30.0
    retry: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _given_up: bool = False

    def retry_delay(self, source: OpenAPISource, backoff: float) -> float | None:
        """The wait after a failed run: at most `retry` inside the window, else None (the backoff)."""
        if source.answered or self._past_bound(source):
            return None
        return min(backoff, self.retry)

    def check(self, source: OpenAPISource | None, v2_merged: bool) -> str | None:
        """readyz: None once the documents are in, published and merged, or past the bound."""
        if source is None:
            return "kube-apiserver's OpenAPI has not been downloaded yet"
        if source.answered and (source.v2 is None or v2_merged):
            return None
        if self._past_bound(source):
            return None
        missing = [
            name
            for name, done in (
                ("v3", source.v3_fetched or source.v3_published is False),
                ("v2", source.v2 is not None or source.v2_published is False),
            )
            if not done
        ]
        if not missing:
            return "kube-apiserver's OpenAPI v2 is downloaded but not merged yet"
        detail = f" ({source.last_error})" if source.last_error else ""
        return f"kube-apiserver's OpenAPI {' and '.join(missing)} not downloaded yet{detail}"

    def _past_bound(self, source: OpenAPISource) -> bool:
        if source.first_attempt is None or self.clock() - source.first_attempt < self.bound:
            return False
        if not self._given_up and not source.answered:
            self._given_up = True
            log.warning(
                "kube-apiserver's OpenAPI is still not downloaded; readiness no longer waits for it and "
                "retries go back to the backoff (kubectl explain of built-in types fails until it is in)",
                extra=fields(source=source.name, seconds=self.bound, error=source.last_error),
            )
        return True
