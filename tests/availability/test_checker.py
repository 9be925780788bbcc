"""The checker's rate limit on the proxy's suspicions: one check per APIService per second, none lost."""

from __future__ import annotations

from dataclasses import dataclass, field

from aggregator.availability.checker import AvailabilityChecker
from aggregator.availability.status import MemoryStatus
from tests.availability.support import Harness


@dataclass
class RecordingLoops:
    """Stands in for the loop engine: which checks the checker asked for, and when."""

    tracked: set[str]
    asked: list[tuple[str, str, float]] = field(default_factory=list)
    now: float = 0.0

    def __contains__(self, key: object) -> bool:
        return key in self.tracked

    def poke(self, key: str) -> None:
        self.asked.append(("now", key, self.now))

    def poke_within(self, key: str, delay: float) -> None:
        self.asked.append(("at", key, round(self.now + delay, 6)))


def test_suspicions_are_rate_limited_per_apiservice_and_never_lost(harness: Harness) -> None:
    loops = RecordingLoops({"v1.a.example.com", "v1.b.example.com"})
    checker = AvailabilityChecker(
        harness.store, harness.probe, harness.metrics, MemoryStatus(), timer=lambda: loops.now
    )
    harness.store.add_listener(checker.on_store_event)
    checker.loops = loops  # type: ignore[assignment]

    def suspect_at(now: float, name: str = "v1.a.example.com") -> None:
        loops.now = now
        checker.suspect(name)

    suspect_at(0.0)  # checked at once
    suspect_at(0.3)  # within the second: one check at its end
    suspect_at(0.5)  # already covered by that one
    suspect_at(0.6, "v1.b.example.com")  # another APIService has its own budget
    suspect_at(1.0)  # while the trailing check runs: the next one a second later
    suspect_at(3.5)  # long after: at once again
    suspect_at(9.0, "kube-apiserver")  # not an APIService being checked
    assert loops.asked == [
        ("now", "v1.a.example.com", 0.0),
        ("at", "v1.a.example.com", 1.0),
        ("now", "v1.b.example.com", 0.6),
        ("at", "v1.a.example.com", 2.0),
        ("now", "v1.a.example.com", 3.5),
    ]
