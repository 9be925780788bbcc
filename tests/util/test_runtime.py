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
