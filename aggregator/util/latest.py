"""`Latest`: the newest value of something another part owns, and who follows it.

A worker process receives copies of what its control process reads (the cluster's authentication
ConfigMap, say) and hands each to the components built from it. A follower added after a copy
arrived gets that copy at once, so nothing built later waits for the next change to catch up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Latest(Generic[T]):
    def __init__(self) -> None:
        self.value: T | None = None
        self._followers: list[Callable[[T], None]] = []

    def publish(self, value: T) -> None:
        self.value = value
        for follower in self._followers:
            follower(value)

    def follow(self, follower: Callable[[T], None]) -> None:
        """Call `follower` with every value from now on, starting with the one held (if any)."""
        self._followers.append(follower)
        if self.value is not None:
            follower(self.value)
