"""`computeConcurrencyAllocation`'s contract (conc_alloc_test.go's checks), over generated problems."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.flowcontrol.allocation import MIN_TARGET, AllocationError, AllocItem, compute_allocation

SLACK = 1e-9


@st.composite
def problems(draw: st.DrawFn) -> tuple[int, list[AllocItem]]:
    items = []
    for _ in range(draw(st.integers(0, 9))):
        lower = draw(st.floats(0, 4))
        target = lower + draw(st.floats(0, 2))
        upper = lower + draw(st.floats(0, 3))
        items.append(AllocItem(target, lower, upper))
    low = sum(i.lower for i in items)
    high = sum(i.upper for i in items)
    required = draw(st.integers(max(0, math.floor(low) - 1), math.ceil(high) + 1))
    return required, items


@settings(max_examples=400, deadline=None)
@given(problems())
def test_the_allocation_sums_to_the_requirement_within_bounds_and_is_fair(problem: tuple[int, list[AllocItem]]) -> None:
    required, items = problem
    low, high = sum(i.lower for i in items), sum(i.upper for i in items)
    try:
        allocs, fair_prop = compute_allocation(required, items)
    except AllocationError:
        assert low - required > 1e-7 or required - high > 1e-7
        return
    assert abs(sum(allocs) - required) <= 1e-6 * max(1, required)
    if required == 0:
        assert allocs == [0.0] * len(items)  # upstream answers zeros, bounds within epsilon or not
        return
    for item, alloc in zip(items, allocs, strict=True):
        assert item.lower - SLACK <= alloc <= item.upper + SLACK
        fair = fair_prop * max(item.target, MIN_TARGET)
        if fair <= item.lower:
            assert alloc == item.lower
        elif fair >= item.upper:
            assert alloc == item.upper
        else:
            assert math.isclose(alloc, fair, rel_tol=1e-6, abs_tol=1e-9)
