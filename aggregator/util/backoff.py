"""Retry delays: `initial`, doubling after each consecutive failure, capped at `maximum`.

Every background loop (discovery fetches, availability re-checks, OpenAPI downloads, watches)
retries the same way, like client-go's `ItemExponentialFailureRateLimiter`.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def exponential_delay(failures: int, initial: float, maximum: float) -> float:
    """The wait after the `failures`-th consecutive failure (the first waits `initial`)."""
    return float(min(maximum, initial * 2 ** min(max(failures, 1) - 1, 30)))


class Backoff:
    """Stateful exponential backoff with downward jitter: `initial * factor**n`, capped, times
    `(1 - jitter * rand)`.

    Jitter spreads the retries of many gateways after a kube-apiserver restart; jittering downwards
    keeps every delay at or below the cap.
    """

    def __init__(
        self,
        initial: float = 0.5,
        cap: float = 30.0,
        *,
        factor: float = 2.0,
        jitter: float = 0.5,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.initial, self.cap, self.factor, self.jitter = initial, cap, factor, jitter
        self._rng = rng or random.Random().random
        self.attempt = 0

    def next(self) -> float:
        base = min(self.cap, self.initial * self.factor**self.attempt)
        if base < self.cap:
            self.attempt += 1
        return base * (1.0 - self.jitter * self._rng())

    def reset(self) -> None:
        self.attempt = 0
