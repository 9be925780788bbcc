"""A pipeline gate inside its phase span: authentication, authorization, priority and fairness.

The composition root wraps a gate only when tracing is configured; the wrapper costs one
attribute read for a request that is not sampled. While a traced gate runs, its phase is the
task's active phase (`api.ACTIVE_PHASE`), so the reviews it makes are its children. A gate that
answers (a 401, a 403, a 429) ends its phase with that status.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aggregator.tracing.api import ACTIVE_PHASE, PhaseSpan, RequestSpan

AUTHENTICATION = "authentication"
AUTHORIZATION = "authorization"
PRIORITY_AND_FAIRNESS = "priority-and-fairness"


class Spanned(Protocol):
    span: RequestSpan | None


C = TypeVar("C", bound=Spanned)


def _status(answer: object) -> int | None:
    status = getattr(answer, "status", None)
    return status if isinstance(status, int) else None


def traced_gate(name: str, gate: Callable[[C], Any]) -> Callable[[C], Any]:
    """`gate`, run inside a `name` phase span when the request is traced."""

    def run(ctx: C) -> Any:
        span = ctx.span
        if span is None:
            return gate(ctx)
        phase = span.phase(name)
        token = ACTIVE_PHASE.set(phase)
        try:
            answer = gate(ctx)
        except BaseException as err:
            phase.end(error=f"{type(err).__name__}: {err}")
            raise
        finally:
            ACTIVE_PHASE.reset(token)
        if inspect.isawaitable(answer):
            return _awaited(phase, answer)
        phase.end(_status(answer))
        return answer

    return run


async def _awaited(phase: PhaseSpan, answer: Awaitable[Any]) -> Any:
    token = ACTIVE_PHASE.set(phase)
    try:
        result = await answer
    except BaseException as err:
        phase.end(error=f"{type(err).__name__}: {err}")
        raise
    finally:
        ACTIVE_PHASE.reset(token)
    phase.end(_status(result))
    return result
