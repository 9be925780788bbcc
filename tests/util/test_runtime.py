"""Process plumbing: the heap settled out of the collector's reach once started, and again later."""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a process of its own: frozen objects stay frozen (never in a test's own process).
SCRIPT = """
import asyncio, gc, json
from aggregator.util import runtime

seen = []
async def main():
    state = [[i] for i in range(1000)]  # what start-up built
    runtime.settle_heap()
    seen.append(gc.get_freeze_count())
    later = asyncio.ensure_future(runtime.settle_heap_later((0.05, 0.1)))
    state += [[i] for i in range(5000)]  # what the first checks and fetches build
    await asyncio.sleep(0.07)
    seen.append(gc.get_freeze_count())
    state += [[i] for i in range(5000)]
    await later
    seen.append(gc.get_freeze_count())
    print(json.dumps({"frozen": seen, "young": gc.get_threshold()[0]}))
asyncio.run(main())
"""


def test_the_heap_is_settled_again_after_the_first_checks_and_fetches() -> None:
    """A control process of 5000 APIServices held some 800,000 objects that every full collection
    walked (over a second of CPU a minute); settled once more after start-up, they are not walked."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout)
    first, second, third = result["frozen"]
    assert second >= first + 4500
    assert third >= second + 4500
    assert result["young"] == 10_000


HELD = """
import gc, json, time
from aggregator.util import runtime

runtime.hold_collector(limit=30.0)
held = gc.isenabled()
before = gc.get_count()[0]
state = [[i] for i in range(50_000)]  # start-up's objects: no collection walks them meanwhile
grew = gc.get_count()[0] - before
runtime.settle_heap()
settled = gc.isenabled()
runtime.hold_collector(limit=30.0)
loaded = [[i] for i in range(1000)]  # the store, synced
frozen = gc.get_freeze_count()
runtime.release_collector()
released = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count() - frozen}
runtime.hold_collector(limit=0.05)  # a start-up that never ends
deadline = time.monotonic() + 20
while not gc.isenabled() and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"held": held, "grew": grew, "settled": settled, "after_limit": gc.isenabled(), "released": released}))
"""


def test_start_up_runs_without_the_collector_until_released_settled_or_the_limit() -> None:
    """20,000 APIServices started a third faster without full collections walking the state being
    loaded; the collector is back once the heap settles, and after the limit if it never does."""
    out = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout)
    assert result["held"] is False
    assert result["grew"] > 40_000  # nothing collected the young generation (700 at a time) on the way
    assert result["settled"] is True
    assert result["after_limit"] is True
    # Released at the store's sync: what is loaded is out of reach, and the collector runs again.
    assert result["released"]["enabled"] is True
    assert result["released"]["frozen"] >= 1000
