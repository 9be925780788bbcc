"""Spans are exported within 50 ms of their end instead of the batch processor's 5 s
(`OTEL_BSP_SCHEDULE_DELAY`, the OpenTelemetry SDK's own setting, read when the exporter is built):
tests wait for spans, and a shorter wait is only a faster pass."""

from __future__ import annotations

import pytest

SCHEDULE_DELAY = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@pytest.fixture(autouse=True)
def quick_export(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SCHEDULE_DELAY.items():
        monkeypatch.setenv(name, value)
