"""Process plumbing shared by the gateway and the sample server: the event loop and the stop signal."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading

from aggregator.util.memory import limit_arenas

# Allocations between two young-generation collections (CPython's default: 700). A proxied request
# allocates a few hundred tracked objects and frees nearly all of them itself; a young collection
# costs about the objects still alive, not those allocated, so collecting 14x less often spares
# most of the collector's share of a request (about 3% of its CPU) for a few thousand more objects
# waiting at most one collection longer.
YOUNG_THRESHOLD = 10_000
# After start-up the heap keeps growing while every APIService's first checks, discovery fetches and
# OpenAPI downloads land (the longest refresh period is a minute, and 5000 first fetches take about
# as long): settled again this many seconds after start, so what they built (connections, documents,
# verdicts: most of a large gateway's heap) leaves the collector's reach too.
SETTLE_AGAIN = (60.0, 120.0)
# The longest a start-up runs without the cyclic collector (`hold_collector`).
HOLD_LIMIT = 300.0


def settle_heap() -> None:
    """Once a server process has started: collect, then move every object alive now (modules,
    classes, the kubernetes client's models, the first state) out of the collector's reach
    (`gc.freeze`). They live as long as the process; the cyclic collector then scans only what
    requests and later changes allocate, instead of the whole start-up heap at every full
    collection. The young generation is collected less often (`YOUNG_THRESHOLD`). For server
    processes only, never a test's (what a test frees would stay)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.enable()


def hold_collector(limit: float = HOLD_LIMIT) -> None:
    """At a server process's start: no cyclic collection until `release_collector` or
    `settle_heap`, or `limit` seconds.

    Loading 20,000 APIServices from a folder (or a worker's first state) allocates millions of
    objects that all live on, and each full collection on the way walked all of them again for
    nothing: `workers serving` after 38-41 s instead of 53-76 s at 20,000 (load 7-10). The limit
    bounds the cyclic garbage of a start that never ends (a kube-apiserver that never answers)."""
    gc.disable()
    timer = threading.Timer(limit, gc.enable)
    timer.daemon = True
    timer.start()


def start_server_process() -> None:
    """What every server process (a single process, the control, a worker) does first, before its
    event loop: two malloc arenas (`util/memory.limit_arenas`) and no cyclic collection while its
    state loads (`hold_collector`)."""
    limit_arenas()
    hold_collector()


def release_collector() -> None:
    """The process that checks backends calls this once its store has synced, before the first
    checks: what is loaded leaves the collector's reach (no collection: it is all alive) and the
    collector runs again, so the first round's failed checks (an exception and its frames, a cycle
    each) are collected as they come instead of piling up until `settle_heap` (at 20,000 dead
    backends, 150 MiB more resident for good)."""
    gc.freeze()
    gc.enable()


async def settle_heap_later(delays: tuple[float, ...] = SETTLE_AGAIN) -> None:
    """Move what is alive out of the collector's reach again at each of `delays` (seconds from now).

    Without it, 5000 APIServices leave some 800,000 objects that every full collection walks
    (over a second of CPU every minute or so in the process that checks and fetches, and the
    event loop stalls as long), although nearly all of them live as long as the process. No full
    collection here (it would cost that second once more): the younger generations are
    collected, then everything alive is frozen. Cyclic garbage already in the oldest generation
    would stay; a steady gateway makes none (its full collections found nothing to free)."""
    started = asyncio.get_running_loop().time()
    for delay in delays:
        await asyncio.sleep(max(0.0, started + delay - asyncio.get_running_loop().time()))
        gc.collect(1)
        gc.freeze()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (Linux): about +40% requests/s through the proxy."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def wait_for_termination() -> None:
    """Return when the process receives SIGTERM or SIGINT; later ones are ignored (a worker gets
    Ctrl-C's SIGINT and its supervisor's SIGTERM: both mean the one graceful stop)."""
    await TerminationSignals().first()


class TerminationSignals:
    """SIGTERM and SIGINT as component-base's `SetupSignalContext` treats them: the first asks for
    a graceful stop, a second one during it for an immediate exit (there `os.Exit(1)`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._first = asyncio.Event()
        self._second = asyncio.Event()
        self._name = ""
        for sig in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        if self._first.is_set():
            self._second.set()
        else:
            self._name = sig.name
            self._first.set()

    async def first(self) -> str:
        """Wait for the first signal; returns its name."""
        await self._first.wait()
        return self._name

    async def second(self) -> None:
        await self._second.wait()

    def close(self) -> None:
        for sig in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.remove_signal_handler(sig)
