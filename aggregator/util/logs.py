"""Logging: text or JSON lines, one access line per request, never a credential.

Log calls pass structured fields with `extra={"fields": {...}}`; both formats render them, so a
line is greppable as text and queryable as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
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


def configure_logging(log_format: str = "text", verbosity: int = 0) -> None:
    """Install one stderr handler on the root logger; `-v 4` and above enables debug lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    # aiohttp's own access log is replaced by ours; its internals are noisy below WARNING.
    logging.getLogger("aiohttp.access").disabled = True
    logging.getLogger("aiohttp").setLevel(logging.DEBUG if verbosity >= 8 else logging.WARNING)


def fields(**values: Any) -> dict[str, Any]:
    """Shorthand for `extra=fields(a=1)` in log calls."""
    return {"fields": values}
