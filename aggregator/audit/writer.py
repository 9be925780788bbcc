"""The audit log backend: a bounded queue drained by one thread, so auditing never blocks a request.

This is kube-apiserver's `--audit-log-mode=batch` (`k8s.io/apiserver/plugin/pkg/audit/buffered`
in front of `plugin/pkg/audit/log`): `submit` only enqueues, and when the queue is full the event
is dropped and counted as `apiserver_audit_error_total{plugin="buffered"}`, like upstream's
"audit buffer queue blocked". The thread encodes each event and writes it as one line; a failed
write counts as `{plugin="log"}`. The `blocking` and `blocking-strict` modes are not offered: they
put disk latency (and, for strict, disk errors) on the request path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from aggregator.audit.event import Event, encode_event
from aggregator.audit.sinks import LineSink
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 10000  # upstream's defaultBatchBufferSize
PLUGIN_BUFFERED = "buffered"
PLUGIN_LOG = "log"
_LOG_EVERY = 10.0
_STOP = object()


class _Throttled:
    """Counts a recurring failure and logs it at most every `_LOG_EVERY` seconds."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.pending = 0
        self.last = -_LOG_EVERY

    def note(self, **extra: object) -> None:
        self.pending += 1
        now = time.monotonic()
        if now - self.last >= _LOG_EVERY:
            log.error(self.message, extra=fields(events=self.pending, **extra))
            self.pending = 0
            self.last = now


class BufferedWriter:
    """`submit` from the event loop; one daemon thread writes. `stop` drains what is queued."""

    def __init__(
        self,
        sink: LineSink,
        errors: Counter,
        *,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        encode: Callable[[Event], bytes] = encode_event,
    ) -> None:
        if buffer_size <= 0:
            raise ValueError("buffer_size must be positive")
        self._sink = sink
        self._encode = encode
        self._queue: queue.Queue[object] = queue.Queue(buffer_size)
        self._buffer_errors = errors.labels(PLUGIN_BUFFERED)
        self._log_errors = errors.labels(PLUGIN_LOG)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._dropped = _Throttled("audit buffer queue blocked: events dropped")
        self._failed = _Throttled("audit log write failed: events lost")

    def submit(self, event: Event | bytes) -> bool:
        """Enqueue without waiting; False (and counted) when the event was dropped. Bytes are an
        event another process already encoded (`--workers N`: workers audit, the control process
        alone writes the file, so rotation has one owner)."""
        if self._closed:
            self._buffer_errors.inc()
            return False
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._buffer_errors.inc()
            self._dropped.note()
            return False
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="audit-log-writer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Write what is queued, then close the sink. False when the writer did not finish in time
        (a stuck disk): the thread is a daemon, so it does not hold the process."""
        self._closed = True
        thread = self._thread
        if thread is None:
            self._sink.close()
            return self._queue.empty()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return False
        self._sink.close()
        return True

    def wait_idle(self, timeout: float) -> bool:
        """True once every submitted event has been written (or failed), False after `timeout`."""
        deadline = time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                done.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, (Event, bytes))
                self._write(item)
            finally:
                self._queue.task_done()

    def _write(self, event: Event | bytes) -> None:
        try:
            line = event if isinstance(event, bytes) else self._encode(event)
            self._sink.write(line)
        except Exception as err:  # a bad event or a full disk must not end the writer
            self._log_errors.inc()
            self._failed.note(reason=f"{type(err).__name__}: {err}")
