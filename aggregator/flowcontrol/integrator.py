"""The time integral of a piecewise-constant value: `fairqueuing/integrator.go`'s moments and results.

Each priority level integrates its seat demand (seats in use plus seats waiting: the time spent at
each value comes from its metrics' `StateClock`, `LevelMetrics.take_demand`); every borrowing
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


def results_of(moments: Moments, low: float, high: float) -> IntegratorResults:
    """`GetResults`: the period's duration, average, deviation and extremes."""
    avg, dev = moments.avg_and_stddev()
    return IntegratorResults(moments.elapsed, avg, dev, low, high)


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
