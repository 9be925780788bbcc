"""Fakes for the audit tests: a writer that keeps events, a scripted clock, mocked requests."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from aggregator.audit.event import Event, encode_event
from aggregator.audit.policy import parse_policy
from aggregator.audit.recorder import AuditMetrics, Auditor
from aggregator.web.context import RequestContext
from aggregator.web.requestinfo import RequestInfo
from tests.support.contexts import context_for

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


class ListWriter:
    """An EventWriter that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def submit(self, event: Event | bytes) -> bool:
        # Encoded events (bytes) come only from worker processes, through the control's publisher.
        assert isinstance(event, Event), "the Auditor submits Event objects"
        self.events.append(event)
        return True

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 10.0) -> bool:
        return True

    def wait_idle(self, timeout: float) -> bool:
        return True

    def documents(self) -> list[dict[str, Any]]:
        return [json.loads(encode_event(event)) for event in self.events]


class Clock:
    """Returns the given moments in order, then keeps advancing by a millisecond."""

    def __init__(self, moments: Iterable[datetime] = ()) -> None:
        self._moments = list(moments)
        self._last = T0

    def __call__(self) -> datetime:
        if self._moments:
            self._last = self._moments.pop(0)
        else:
            self._last += timedelta(milliseconds=1)
        return self._last


def policy_for(level: str, **rule: Any) -> str:
    extra = "".join(f"  {key}: {json.dumps(value)}\n" for key, value in rule.items())
    return f"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: {level}\n{extra}"


def auditor(
    policy: str, *, clock: Clock | None = None, metrics: AuditMetrics | None = None
) -> tuple[Auditor, ListWriter]:
    writer = ListWriter()
    made = Auditor(
        parse_policy(policy),
        writer,
        metrics or AuditMetrics(CollectorRegistry()),
        now=clock or Clock(),
        new_id=lambda: "00000000-0000-4000-8000-000000000000",
    )
    return made, writer


def mocked_request(
    method: str,
    path: str,
    headers: Mapping[str, str] | None = None,
    *,
    peer: str | None = "10.0.0.7",
) -> RequestContext:
    """The context the pipeline builds for such a request (from `peer`, without TLS)."""
    return context_for(method, path, headers=headers, remote=peer)


def info_of(ctx: RequestContext) -> RequestInfo:
    """The RequestInfo the auditor is given: the pipeline audits only requests that have one."""
    assert ctx.info is not None, ctx.info_error
    return ctx.info
