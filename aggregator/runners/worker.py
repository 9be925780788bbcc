"""One worker process: `python -m aggregator.runners.worker <fd>`, started by the supervisor.

It reads the configuration, its `Hello` and the first snapshot from the channel (file descriptor `fd`,
one end of a socketpair), builds its gateway from them (`assembly.build_gateway` with the
replica), listens on the shared port with SO_REUSEPORT, and serves until SIGTERM/SIGINT or until
the control process goes away. Shutdown is the single process's (`server.shut_down`): /readyz fails at once, the listener stays
open for --shutdown-delay-duration, then closes, in-flight requests drain and watches and tunnels
are ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace

from aggregator.assembly import build_gateway
from aggregator.config import Config
from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.runners.server import GatewayServer, shut_down
from aggregator.util.flags import ConfigError
from aggregator.util.logs import configure_logging, fields
from aggregator.util.runtime import new_event_loop, settle_heap, start_server_process, wait_for_termination
from aggregator.workers.channel import Channel
from aggregator.workers.messages import Hello, Listening
from aggregator.workers.replica import Replica

log = logging.getLogger(__name__)

EXIT_USAGE = 2
EXIT_CONTROL_LOST = 3


class _WorkerField(logging.Filter):
    """Every log line of a worker names it (`worker=<index>`)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.fields = {"worker": self.index, **getattr(record, "fields", {})}
        return True


async def serve(fd: int) -> int:
    channel = await Channel.open(socket.socket(fileno=fd))
    config = await channel.receive()
    if not isinstance(config, Config):
        raise RuntimeError(
            f"expected the configuration from the control process, got {type(config).__name__}"
        )
    hello = await channel.receive()
    if not isinstance(hello, Hello):
        raise RuntimeError(f"expected a Hello from the control process, got {type(hello).__name__}")
    stop_logging = configure_logging(config.logging.format, config.logging.verbosity)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerField(hello.index))
    try:
        metrics = GatewayMetrics.declare()
        replica = Replica(channel, hello, collect=lambda: list(metrics.registry.collect()))
        replica.apply(await channel.receive())  # the snapshot: the store is full before routing
        gateway = build_gateway(config, replica=replica, metrics=metrics)
        server = GatewayServer(config, gateway, reuse_port=True)
        following = asyncio.create_task(replica.run(), name="replica")
        stop = asyncio.create_task(wait_for_termination(), name="signals")
        try:
            await server.start()
        except ConfigError as err:
            print(f"aggregator serve: {err}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        settle_heap()
        channel.send(Listening(os.getpid()))
        await asyncio.wait([stop, following], return_when=asyncio.FIRST_COMPLETED)
        lost = following.done()
        log.info("shutting down" if not lost else "shutting down: the control process is gone")
        await shut_down(
            server,
            replace(config.shutdown, delay=0.0) if lost else config.shutdown,
        )
        stop.cancel()
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        channel.close()
        return EXIT_CONTROL_LOST if lost else 0
    finally:
        stop_logging()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not args[0].isdigit():
        print(
            "usage: python -m aggregator.runners.worker <channel fd> (started by aggregator serve)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    start_server_process()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            return runner.run(serve(int(args[0])))
        except EOFError:
            log.error("the control process closed the channel before the worker started", extra=fields())
            return EXIT_CONTROL_LOST


if __name__ == "__main__":
    sys.exit(main())
