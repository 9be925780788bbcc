"""Reading the gateway's structured log records in tests."""

from __future__ import annotations

import logging
from typing import Any


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed (`extra=fields(...)`, `aggregator/util/logs.py`):
    LogRecord has no such attribute to a type checker, and a record without them fails here."""
    found = getattr(record, "fields", None)
    assert isinstance(found, dict), f"no structured fields on {record.getMessage()!r}"
    return found
