"""`aggregator serve --workers N` (N > 1): the control process and its N workers.

The supervisor is the control process. It builds the whole gateway as one process would
(`assembly.build_gateway`: sources and store, availability with its probes, status writes and
leader election, discovery and OpenAPI fetches and renders, the requestheader ConfigMap watch)
and starts it without a listener; `publisher.py` feeds every worker from it. So backends and
kube-apiserver see the same background traffic with 1 worker as with 8.

Workers are fresh interpreters (`python -m aggregator.runners.worker`), never forks: the control
has an event loop and threads by then. Each gets one end of a socketpair as its channel. A
worker that dies is logged with its exit cause and started again (its index kept, after a delay
that grows while it keeps dying young). SIGTERM or SIGINT: the control fails readiness, every
worker runs the single process's shutdown (readyz fails, the listener stays open for
--shutdown-delay-duration, in-flight requests drain), then the control stops; exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from aggregator.assembly import Gateway, build_gateway
from aggregator.backends.h1 import MAX_IDLE
from aggregator.backends.registry import BackendRegistry
from aggregator.config import Config
from aggregator.runners.serving import serving_certificate, shutdown_bound
from aggregator.tls.options import ServingConfig
from aggregator.util.backoff import exponential_delay
from aggregator.util.flags import ConfigError
from aggregator.util.logs import fields
from aggregator.util.memory import map_large_allocations
from aggregator.util.runtime import (
    TerminationSignals,
    new_event_loop,
    release_collector,
    settle_heap,
    settle_heap_later,
    start_server_process,
)
from aggregator.util.tasks import TaskSet
from aggregator.web.certexpiry import SERVING
from aggregator.workers.channel import Channel
from aggregator.workers.messages import Hello, Listening
from aggregator.workers.metrics import WorkerMetrics
from aggregator.workers.publisher import Publisher, families

log = logging.getLogger(__name__)

WORKER_MODULE = "aggregator.runners.worker"
# A worker that ran at least this long before dying is restarted at once; one that dies younger
# is restarted after a delay doubling from RESTART_INITIAL up to RESTART_MAX.
STEADY_AFTER = 10.0
RESTART_INITIAL = 0.5
RESTART_MAX = 30.0
# Beyond their own shutdown's bound (`server.shutdown_bound`), how long workers may take to stop
# before they are killed.
DRAIN_GRACE = 5.0
EXIT_USAGE = 2
# The control's bound on idle backend connections (a process that proxies keeps h1.MAX_IDLE: its
# connections keep their whole read buffers): every probe of 16,384 Services finds its connection.
CONTROL_MAX_IDLE = 16384


def exit_cause(returncode: int) -> str:
    """`exit code 3`, or the signal's name (`killed by SIGKILL`)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def reserve_port(serving: ServingConfig) -> int:
    """Bind the address once without SO_REUSEPORT: a port anyone holds (even another gateway's
    group, which SO_REUSEPORT alone would silently share) is a start-up error, and port 0 is
    resolved to one port every worker then joins."""
    family = socket.AF_INET6 if ":" in serving.bind_address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((serving.bind_address, serving.port))
        except OSError as err:
            address = f"{serving.bind_address}:{serving.port}"
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise ConfigError("--secure-port", f"cannot listen on {address}: {reason}") from err
        return int(probe.getsockname()[1])


@dataclass(eq=False)
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    failures: int = 0
    listening: asyncio.Future[int] | None = None


class Supervisor:
    def __init__(self, config: Config, control: Gateway) -> None:
        self.config = config
        self.count = config.workers
        self.control = control
        self.metrics = WorkerMetrics(config.workers)
        derived = control.control
        self.publisher = Publisher(
            store=control.store,
            availability=derived.availability,
            health=control.health,
            discovery=derived.discovery,
            openapi=derived.openapi,
            cluster_auth=derived.cluster_auth,
            collectors=lambda: families([control.metrics.registry, self.metrics.registry]),
            audit=control.auditor.writer if control.auditor is not None else None,
            rbac=derived.rbac,
            quarantine=derived.quarantine,
        )
        # API Priority and Fairness: every level's limit divided among the workers (flowcontrol/sharing.py).
        self.seats = control.flowcontrol.shared_by_workers() if control.flowcontrol is not None else None
        self.workers = [_Worker(index) for index in range(config.workers)]
        self.stopping = False
        self._tasks = TaskSet("supervisor")

    async def start(self) -> None:
        """Start the control, then every worker; ConfigError if a worker cannot start."""
        self.control.store.when_synced(self._tasks, release_collector, name="release-collector")
        await self.control.start()
        await self.publisher.start()
        for worker in self.workers:
            await self._spawn(worker)
        for worker in self.workers:
            assert worker.listening is not None
            code = await worker.listening
            if code != 0:
                raise ConfigError("--workers", f"worker {worker.index} could not start ({exit_cause(code)})")
        log.info(
            "workers serving",
            extra=fields(
                workers=self.count,
                pids=",".join(str(w.process.pid) for w in self.workers if w.process is not None),
                control_pid=os.getpid(),
            ),
        )
        # The control's state is loaded and its workers run: out of the collector's reach, now and
        # once its first checks and fetches have landed (it was the last process without this).
        settle_heap()
        self._tasks.spawn(settle_heap_later(), name="settle-heap")

    async def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            worker.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", WORKER_MODULE, str(theirs.fileno()), pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()
        worker.started = time.monotonic()
        worker.listening = asyncio.get_running_loop().create_future()
        channel = await Channel.open(ours)
        channel.send(self.config)  # first: the worker builds its gateway from the control's configuration
        channel.send(Hello(worker.index, self.count, self.control.hop, self.publisher.checks()))
        self._tasks.spawn(self._follow(worker, worker.process, channel), name=f"worker-{worker.index}")

    async def _follow(self, worker: _Worker, process: asyncio.subprocess.Process, channel: Channel) -> None:
        """Serve the worker's channel until it exits, then restart it (unless stopping)."""
        listening = worker.listening
        assert listening is not None
        if self.seats is not None:
            self.seats.connect(worker.index, channel.send)
        serving = asyncio.create_task(
            self.publisher.serve(worker.index, channel, on=self._heard(listening, worker.index))
        )
        code = await process.wait()
        await serving
        if self.seats is not None:
            self.seats.disconnect(worker.index)
        if not listening.done():
            listening.set_result(code if code != 0 else 1)
            return  # a worker that could not start stops the start-up
        if self.stopping:
            return
        lived = time.monotonic() - worker.started
        worker.failures = 0 if lived >= STEADY_AFTER else worker.failures + 1
        delay = exponential_delay(worker.failures, RESTART_INITIAL, RESTART_MAX) if worker.failures else 0.0
        log.error(
            "worker died; starting it again",
            extra=fields(
                worker=worker.index,
                pid=process.pid,
                cause=exit_cause(code),
                lived_seconds=round(lived, 1),
                restart_in_seconds=round(delay, 1),
            ),
        )
        self.metrics.restarts.labels(str(worker.index)).inc()
        await asyncio.sleep(delay)
        if not self.stopping:
            await self._spawn(worker)

    def _heard(self, listening: asyncio.Future[int], index: int) -> Callable[[object], bool]:
        def on(message: object) -> bool:
            if isinstance(message, Listening):
                if not listening.done():
                    listening.set_result(0)
                return True
            return self.seats is not None and self.seats.receive(index, message)

        return on

    def kill_workers(self) -> None:
        """A second signal: no more draining."""
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()

    async def stop(self) -> None:
        """Every worker drains (their own shutdown sequence), then the control stops."""
        self.stopping = True
        self.control.shutting_down = True
        running = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = shutdown_bound(self.config.shutdown) + DRAIN_GRACE
        waits = [asyncio.ensure_future(p.wait()) for p in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=deadline)
            for process in running:
                if process.returncode is None:
                    log.error("worker did not drain in time; killing it", extra=fields(pid=process.pid))
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if late:
                await asyncio.wait(late)
        await self._tasks.close()
        await self.publisher.stop()
        await self.control.stop()


async def supervise(config: Config) -> int:
    """Run the control and `config.workers` workers until SIGTERM or SIGINT; the process exit code."""
    # refused (or generated, once) before the port and before any worker, as a single process does
    serving = serving_certificate(config)
    config = replace(config, serving=replace(config.serving, port=reserve_port(config.serving)))
    control = build_gateway(config, serving=False)
    control_backends(control.backends)
    # The group's metrics take gauges from the control: it follows the serving pair too.
    expiry = control.metrics.exposition.certificate_expiry
    expiry.follow(SERVING, lambda: (serving.cert_file, [serving.current.leaf]))
    serving.start()
    supervisor = Supervisor(config, control)
    # Signals are caught from here on: a SIGTERM during start-up stops the group once it started.
    signals = TerminationSignals()
    stop = asyncio.create_task(signals.first(), name="signals")
    await asyncio.sleep(0)
    try:
        await supervisor.start()
    except BaseException:
        stop.cancel()
        signals.close()
        await supervisor.stop()
        await serving.stop()
        raise
    received = await stop
    log.info("shutting down", extra=fields(workers=config.workers, signal=received))
    stopping = asyncio.ensure_future(supervisor.stop())
    second = asyncio.ensure_future(signals.second())
    try:
        await asyncio.wait({stopping, second}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signals.close()
    if not stopping.done():
        # component-base's SetupSignalContext: a second signal exits at once, with 1
        log.warning("second signal received, exiting without finishing the shutdown")
        supervisor.kill_workers()
        stopping.cancel()
        return 1
    second.cancel()
    stopping.result()
    await serving.stop()
    return 0


def control_backends(backends: BackendRegistry) -> None:
    """How the control process, which probes and fetches and proxies nothing, holds its backends."""
    # Its idle connections cost a page or two each (`run`): enough for every backend's probes to
    # find theirs warm, within the file descriptors the process may open.
    backends.idle.limit = control_idle_limit()
    # Its large allocations are mappings (`run`): TLS records are read into buffers of their size.
    backends.buffered_reads = True


def control_idle_limit() -> int:
    """Idle backend connections the control keeps: up to CONTROL_MAX_IDLE, and at most half the
    file descriptors it may open (the rest for connections in use, files and kube-apiserver)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONTROL_MAX_IDLE
    return max(MAX_IDLE, min(CONTROL_MAX_IDLE, soft // 2))


def run(config: Config) -> int:
    # The control probes and fetches every backend and proxies nothing: its TLS connections keep
    # only what their answers wrote of their read buffers (`util/memory.py`).
    map_large_allocations()
    start_server_process()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(supervise(config))
