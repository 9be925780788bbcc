"""A time integral of a piecewise-constant value: `fairqueuing/integrator.go`.

Each priority level integrates its seat demand (seats in use plus seats waiting); every borrowing
adjustment reads the period's average, standard deviation and high watermark and starts over.
The moments add up, which is how worker processes' demands are combined (`sharing.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Moments:
    elapsed: float = 0.0  # the integral of dt
    integral_x: float = 0.0
    integral_xx: float = 0.0

    def __add__(self, other: Moments) -> Moments:
        return Moments(
            self.elapsed + other.elapsed, self.integral_x + other.integral_x, self.integral_xx + other.integral_xx
        )

    def avg_and_stddev(self) -> tuple[float, float]:
        if self.elapsed <= 0:
            return math.nan, math.nan
        avg = self.integral_x / self.elapsed
        variance = self.integral_xx / self.elapsed - avg * avg
        return (avg, math.sqrt(variance)) if variance >= 0 else (avg, math.nan)


@dataclass(frozen=True, slots=True)
class IntegratorResults:
    duration: float  # seconds
    average: float
    deviation: float
    min: float
    max: float


class Integrator:
    __slots__ = ("_elapsed", "_ix", "_ixx", "last", "max", "min", "x")

    def __init__(self, now: float) -> None:
        self.last = now
        self.x = 0.0
        self._elapsed = self._ix = self._ixx = 0.0
        self.min = self.max = 0.0

    def set(self, x: float, now: float) -> None:
        dt = now - self.last
        self.last = now
        cur = self.x
        self._elapsed += dt
        self._ix += cur * dt
        self._ixx += cur * cur * dt
        self.x = x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x

    def moments(self, now: float) -> Moments:
        self.set(self.x, now)
        return Moments(self._elapsed, self._ix, self._ixx)

    def results(self, now: float) -> IntegratorResults:
        moments = self.moments(now)
        avg, dev = moments.avg_and_stddev()
        return IntegratorResults(moments.elapsed, avg, dev, self.min, self.max)

    def reset(self, now: float) -> IntegratorResults:
        """`Reset`: the period's results, then a new period starting at the current value."""
        results = self.results(now)
        self._elapsed = self._ix = self._ixx = 0.0
        self.min = self.max = self.x
        return results


def combine(parts: list[tuple[Moments, float, float]]) -> IntegratorResults:
    """Results for the sum of several processes' demands over the same period, from each one's
    (moments, min, max): the average is exact; the deviation assumes independent demands; the high
    watermark is the sum of the highs (an upper bound)."""
    if not parts:
        return IntegratorResults(0.0, math.nan, math.nan, 0.0, 0.0)
    duration = max(m.elapsed for m, _, _ in parts)
    if duration <= 0:
        return IntegratorResults(0.0, math.nan, math.nan, sum(lo for _, lo, _ in parts), sum(hi for _, _, hi in parts))
    average = sum(m.integral_x / m.elapsed for m, _, _ in parts if m.elapsed > 0)
    variance = 0.0
    for m, _, _ in parts:
        if m.elapsed > 0:
            _avg, dev = m.avg_and_stddev()
            variance += 0.0 if math.isnan(dev) else dev * dev
    return IntegratorResults(
        duration, average, math.sqrt(variance), sum(lo for _, lo, _ in parts), sum(hi for _, _, hi in parts)
    )
