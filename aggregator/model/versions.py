"""Kube-aware version ordering (apimachinery `version.CompareKubeAwareVersionStrings`).

Discovery lists versions in this order and clients pick the first one, so every corner of the Go
function matters: `\\d` in Go's RE2 is ASCII only, `strconv.Atoi` fails above int64 (making the
version "not kube-like"), GA beats beta beats alpha, and versions that are not kube-like sort after
all kube-like ones in ascending byte order.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

# fullmatch, not `$`: Python's `$` also matches before a trailing newline, Go's does not.
_KUBE_VERSION = re.compile(r"v([0-9]+)(?:(alpha|beta)([0-9]+))?")
_INT64_MAX = 2**63 - 1
_ALPHA, _BETA, _GA = 0, 1, 2


def parse_kube_version(version: str) -> tuple[int, int, int] | None:
    """(type, major, minor) for a kube-like version (`v1`, `v2beta3`, `v1alpha1`), else None."""
    match = _KUBE_VERSION.fullmatch(version)
    if match is None:
        return None
    major = int(match.group(1))
    if major > _INT64_MAX:
        return None
    kind = match.group(2)
    if kind is None:
        return (_GA, major, 0)
    minor = int(match.group(3))
    if minor > _INT64_MAX:
        return None
    return (_ALPHA if kind == "alpha" else _BETA, major, minor)


def compare_kube_aware_versions(v1: str, v2: str) -> int:
    """Positive when `v1` is the more preferred version, negative when `v2` is, 0 when equal.

    Only the sign is meaningful (as upstream, whose result is a difference of integers).
    """
    if v1 == v2:
        return 0
    p1, p2 = parse_kube_version(v1), parse_kube_version(v2)
    if p1 is None and p2 is None:
        # strings.Compare(v2, v1): non-kube versions end up in ascending order. Python compares code
        # points, which orders like Go's UTF-8 bytes.
        return (v2 > v1) - (v2 < v1)
    if p1 is None:
        return -1
    if p2 is None:
        return 1
    for a, b in zip(p1, p2, strict=True):
        if a != b:
            return 1 if a > b else -1
    return 0


def _descending(v1: str, v2: str) -> int:
    order = compare_kube_aware_versions(v2, v1)
    # Equal-comparing spellings (`v01`, `v1`) get a fixed order instead of Go's unspecified one.
    return order if order else (v1 > v2) - (v1 < v2)


@functools.lru_cache(maxsize=8192)
def version_sort_key(version: str) -> tuple[int, int, int, int, str] | tuple[int, str]:
    """A sort key placing the most preferred version first (for composite keys).

    The same order as sorting with `compare_kube_aware_versions` descending (equal-comparing
    spellings by their text), as a plain tuple: sorting thousands of APIServices compares tuples
    instead of calling the Go-style comparison for every pair. Versions repeat, so keys are cached.
    """
    parsed = parse_kube_version(version)
    if parsed is None:
        return (1, version)
    kind, major, minor = parsed
    return (0, -kind, -major, -minor, version)


def sort_versions(versions: Iterable[str]) -> list[str]:
    """Most preferred first: `v10, v2, v1, v11beta2, v10beta3, v3beta1, v12alpha1, v11alpha2, foo1, foo10`."""
    return sorted(versions, key=version_sort_key)


def sort_by_version(items: Iterable[T], version: Callable[[T], str]) -> list[T]:
    """Items ordered by their version, most preferred first."""
    return sorted(items, key=lambda item: version_sort_key(version(item)))
