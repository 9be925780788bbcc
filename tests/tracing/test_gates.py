"""`traced_gate`: a gate inside its phase span, whatever way it answers; the phase is the task's
active phase while the gate runs (where review clients find it), and only then. The same wrapper
serves priority and fairness: `traced_gate(PRIORITY_AND_FAIRNESS, gate)`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from aggregator.tracing.api import ClientSpan, PhaseSpan, RequestSpan, active_phase
from aggregator.tracing.gates import PRIORITY_AND_FAIRNESS, traced_gate


@dataclass
class Phase:
    name: str
    ended: list[tuple[int | None, str | None]] = field(default_factory=list)

    def client(self, name: str, *, method: str, url: str) -> ClientSpan:
        raise AssertionError("no client span here")

    def end(self, status: int | None = None, error: str | None = None) -> None:
        self.ended.append((status, error))


@dataclass
class Span:
    phases: list[Phase] = field(default_factory=list)

    def phase(self, name: str) -> PhaseSpan:
        self.phases.append(Phase(name))
        return self.phases[-1]

    def proxy_started(self, apiservice: str, authority: str, method: str, url: str) -> None: ...
    def outgoing(self, headers: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
        return headers

    def dialed(self, endpoint: str, started_ns: int, tcp: float | None, tls: float | None) -> None: ...
    def first_byte(self, endpoint: str, status: int, seconds: float) -> None: ...
    def retried(self, endpoint: str, reason: str, cause: str) -> None: ...
    def ejected(self, endpoint: str, reason: str) -> None: ...
    def proxy_failed(self, hop: str, cause: str) -> None: ...


@dataclass
class Ctx:
    span: RequestSpan | None


@dataclass
class Refusal:
    status: int


def test_an_untraced_request_goes_straight_through() -> None:
    seen: list[PhaseSpan | None] = []

    def gate(_ctx: Ctx) -> None:
        seen.append(active_phase())

    assert traced_gate(PRIORITY_AND_FAIRNESS, gate)(Ctx(None)) is None
    assert seen == [None]


def test_a_gate_that_answers_at_once_ends_its_phase_with_the_status() -> None:
    span = Span()
    assert traced_gate("authorization", lambda _ctx: Refusal(403))(Ctx(span)) == Refusal(403)
    (phase,) = span.phases
    assert (phase.name, phase.ended) == ("authorization", [(403, None)])


async def test_an_awaited_gate_runs_in_its_phase_and_the_phase_is_left_after() -> None:
    span = Span()
    seen: list[PhaseSpan | None] = []

    async def review() -> None:
        seen.append(active_phase())  # what a review client reads

    async def gate(_ctx: Ctx) -> None:
        await asyncio.sleep(0)
        await review()

    answer = traced_gate(PRIORITY_AND_FAIRNESS, gate)(Ctx(span))
    assert active_phase() is None
    assert await answer is None
    (phase,) = span.phases
    assert seen == [phase] and phase.ended == [(None, None)] and active_phase() is None


async def test_a_gate_that_fails_ends_its_phase_with_the_error() -> None:
    span = Span()

    async def gate(_ctx: Ctx) -> None:
        raise RuntimeError("review failed")

    with pytest.raises(RuntimeError):
        await traced_gate("authentication", gate)(Ctx(span))
    assert span.phases[0].ended == [(None, "RuntimeError: review failed")]
    assert active_phase() is None
