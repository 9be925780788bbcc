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


# What a worker's first state and replaced documents leave behind: freed heap below blocks that
# live on (glibc gives back only a free top of its heap by itself).
FREED_BELOW_LIVE = """
import json
from aggregator.util import runtime

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

peak = [bytes(2000) for _ in range(40_000)]  # about 80 MiB of heap, each block written
kept = bytes(2000)  # allocated above them: the heap's top stays in use
del peak
before = rss_kib()
runtime.settle_heap()
print(json.dumps({"before": before, "after": rss_kib()}))
"""


def test_settling_gives_the_freed_heap_back_to_the_kernel() -> None:
    """A worker of 5000 APIServices held about 12 MiB of freed heap for good; settled, it does not."""
    out = subprocess.run(
        [sys.executable, "-c", FREED_BELOW_LIVE], capture_output=True, text=True, check=True, timeout=60
    )
    result = json.loads(out.stdout)
    assert result["before"] - result["after"] > 60 * 1024, result
