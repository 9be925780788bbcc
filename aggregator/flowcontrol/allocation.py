"""`computeConcurrencyAllocation` (k8s.io/apiserver `pkg/util/flowcontrol/conc_alloc.go`).

Given classes with a target, a lower and an upper bound, find the one `fair_prop` such that every
class gets `clamp(fair_prop * target, lower, upper)` and the allocations sum to `required`: the
water-filling behind seat borrowing between priority levels.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TARGET = 0.001
EPSILON = 0.0000001
_MAX_FLOAT32 = 3.4028234663852886e38


class AllocationError(ValueError):
    """The problem has no solution (upstream's error, in its words)."""


@dataclass(frozen=True, slots=True)
class AllocItem:
    target: float
    lower: float
    upper: float


def compute_allocation(required: int, classes: list[AllocItem]) -> tuple[list[float], float]:
    """(allocations, fair_prop) as upstream computes them."""
    if required < 0:
        raise AllocationError("negative sums are not supported")
    required_f = float(required)
    low_sum = high_sum = target_sum = 0.0
    ub_min, ub_max = _MAX_FLOAT32, 0.0
    lb_min, lb_max = _MAX_FLOAT32, 0.0
    relative: list[tuple[float, float, float]] = []  # (target, relative lower, relative upper)
    for index, item in enumerate(classes):
        target = item.target
        if item.lower < 0:
            raise AllocationError(f"lower bound {index} is {item.lower} but negative lower bounds are not allowed")
        if target < item.lower:
            raise AllocationError(f"target {index} is {target}, which is below its lower bound of {item.lower}")
        if item.upper < item.lower:
            raise AllocationError(
                f"upper bound {index} is {item.upper} but should not be less than the lower bound {item.lower}"
            )
        if target < MIN_TARGET:
            target = MIN_TARGET
        low_sum += item.lower
        high_sum += item.upper
        target_sum += target
        rel = (target, item.lower / target, item.upper / target)
        ub_min, ub_max = min(ub_min, rel[2]), max(ub_max, rel[2])
        lb_min, lb_max = min(lb_min, rel[1]), max(lb_max, rel[1])
        relative.append(rel)
    if lb_max > 1:
        raise AllocationError(
            f"lbRange.max-1={lb_max - 1}, which is impossible because lbRange.max can not be greater than 1"
        )
    if low_sum - required_f > EPSILON:
        raise AllocationError(f"lower bounds sum to {low_sum}, which is higher than the required sum of {required}")
    if required_f - high_sum > EPSILON:
        raise AllocationError(f"upper bounds sum to {high_sum}, which is lower than the required sum of {required}")
    answer = [0.0] * len(classes)
    if required == 0:
        return answer, 0.0
    if low_sum - required_f > -EPSILON:
        return [item.lower for item in classes], lb_min
    if required_f - high_sum > -EPSILON:
        return [item.upper for item in classes], ub_max
    fair_prop = required_f / target_sum
    if lb_max <= fair_prop <= ub_min:
        return [rel[0] * fair_prop for rel in relative], fair_prop
    # Some bounds matter: walk the bounds in increasing order (lower bound of item N at 2N, upper at 2N+1).
    bounds = sorted(range(2 * len(relative)), key=lambda packed: relative[packed // 2][1 + packed % 2])
    sum_so_far = low_sum
    fair_prop = lb_min
    sensitive_target_sum = delta_sensitive_target_sum = 0.0
    sensitive_classes = delta_sensitive_classes = 0
    next_index = 0
    while sum_so_far < required_f:
        while True:
            sensitive_target_sum += delta_sensitive_target_sum
            sensitive_classes += delta_sensitive_classes
            if next_index >= len(bounds):
                raise AllocationError("impossible: ran out of bounds to consider in bound-constrained problem")
            packed = bounds[next_index]
            item_index, lower = packed // 2, packed % 2 == 0
            next_bound = relative[item_index][1 if lower else 2]
            if lower:
                delta_sensitive_classes = 1
                delta_sensitive_target_sum = relative[item_index][0]
            else:
                delta_sensitive_classes = -1
                delta_sensitive_target_sum = -relative[item_index][0]
            next_index += 1
            if next_bound > fair_prop:
                break
        if sensitive_classes == 0:
            fair_prop = next_bound
            continue
        delta_fair_prop = (required_f - sum_so_far) / sensitive_target_sum
        next_prop = fair_prop + delta_fair_prop
        if next_prop <= next_bound:
            fair_prop = next_prop
            break
        sum_so_far += (next_bound - fair_prop) * sensitive_target_sum
        fair_prop = next_bound
    allocations = [
        max(item.lower, min(item.upper, fair_prop * rel[0])) for item, rel in zip(classes, relative, strict=True)
    ]
    return allocations, fair_prop
