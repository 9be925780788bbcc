"""`util/memory.limit_arenas`: threads that allocate at once share glibc arenas instead of making
one each (every arena keeps what its thread freed). Run in a fresh interpreter: arenas made
before the limit stay, and pytest's own threads would count."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Four threads each hold a malloc'd block while the others allocate theirs (so none can reuse
# another's arena), then glibc's malloc_stats(3) lists the arenas on stderr ("Arena N:").
SCRIPT = """
import ctypes, sys, threading
from aggregator.util import memory
if sys.argv[1] == "limited":
    assert memory.limit_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held, barrier = [], threading.Barrier(4)
def allocate():
    barrier.wait()
    for _ in range(200):
        held.append(libc.malloc(4096))
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
sys.stderr.flush()
libc.malloc_stats()
"""


def arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_share_two_arenas_once_limited() -> None:
    assert arenas("default") > 2  # what the limit is for: without it, an arena per thread
    assert arenas("limited") <= 2
