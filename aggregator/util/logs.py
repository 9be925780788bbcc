"""Logging: text or JSON lines written from a thread, access lines as `--access-log` says, never a credential.

Log calls pass structured fields with `extra={"fields": {...}}`; both formats render them, so a
line is greppable as text and queryable as JSON.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from collections.abc import Callable
from typing import Any

ACCESS_LOGGER = "aggregator.access"

# Never rendered, even if a caller passes them by mistake.
_SECRET_FIELDS = frozenset({"authorization", "token", "password", "key", "private_key", "bearer"})


def _safe_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    if not isinstance(fields, dict):
        return {}
    return {k: ("[redacted]" if k.lower() in _SECRET_FIELDS else v) for k, v in fields.items()}


class TextFormatter(logging.Formatter):
    """`2026-11-22T10:00:00.123Z INFO logger: message key=value ...`"""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [ts, record.levelname, f"{record.name}:", record.getMessage()]
        for key, value in _safe_fields(record).items():
            text = str(value)
            parts.append(f"{key}={json.dumps(text) if (' ' in text or not text) else text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_safe_fields(record))
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _DeferredQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writer thread as they are: formatting happens there, not on the loop."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def configure_logging(log_format: str = "text", verbosity: int = 0) -> Callable[[], None]:
    """Log to stderr from a writer thread; `-v 4` and above enables debug lines.

    A log call only puts the record on a queue, so a slow stderr (a full pipe, a slow disk) never
    stalls the event loop. Returns the function that flushes and stops the writer (also run at
    exit).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else TextFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    root = logging.getLogger()
    root.handlers[:] = [_DeferredQueueHandler(records)]
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            listener.stop()

    atexit.register(stop)
    # aiohttp's own access log is replaced by ours; its internals are noisy below WARNING.
    logging.getLogger("aiohttp.access").disabled = True
    logging.getLogger("aiohttp").setLevel(logging.DEBUG if verbosity >= 8 else logging.WARNING)
    return stop


def fields(**values: Any) -> dict[str, Any]:
    """Shorthand for `extra=fields(a=1)` in log calls."""
    return {"fields": values}
