"""The narrow interfaces features depend on, so none of them depends on another's implementation.

Like kube-aggregator's two-method `APIHandlerManager`: the proxy knows availability only as
`is_available(name)` and `suspect(name)`, discovery and OpenAPI know the backends only as `fetch(...)`, and the
composition root (`assembly.py`) is the one place that decides which implementation answers.
This module imports nothing from the gateway but plain models, so anything may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from multidict import CIMultiDictProxy

from aggregator.model.apiservice import APIService
from aggregator.model.userinfo import UserInfo


class Component(Protocol):
    """Something with a lifetime: started in wiring order, stopped in reverse."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Availability(Protocol):
    """May requests for this APIService be proxied? (upstream: its `Available` condition)"""

    def is_available(self, name: str) -> bool: ...

    def reason(self, name: str) -> str:
        """The `Available` condition's reason (`ProxyLoop`...), "" when there is none."""
        ...

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with an APIService's name whenever what `is_available` or `reason` answer for
        it may have changed."""
        ...


class Reachability(Protocol):
    """What the availability checker last found about reaching an APIService's backend.

    The discovery fetcher and the OpenAPI downloads ask before they dial: a backend the checker
    found unreachable is not dialed again by them until the checker finds it back (and tells them),
    so a dead backend costs one probe per check, not a probe plus every fetcher's retries. Nor do
    they dial an APIService before its first check: at start-up with thousands of them, checks
    alone make the gateway's first verdicts, and each backend's first handshake is the check's.
    """

    def unreachable(self, name: str) -> str | None:
        """Why the last check could not reach this APIService's backend (its message); None when
        it was reached, or has not been checked yet."""
        ...

    def awaiting_check(self, name: str) -> bool:
        """True while this APIService's first check is queued or under way. Callers wait for its
        verdict (the checker's listeners hear of it) instead of dialing beside it: the check goes
        first, and they then find its connection idle instead of each paying a handshake. False
        once there is a verdict, and for an APIService no running checker tracks."""
        ...


# How long a fetcher waits, without dialing, before it looks at an unreachable (or not yet checked)
# backend again on its own: the checker's word normally comes first (a listener pokes the fetcher).
UNREACHABLE_RECHECK = 600.0


class EjectionReport(Protocol):
    """The proxy ejected an endpoint of this APIService (`reason`), or took it back (`reason` is
    empty): where availability hears of it, to name it in the condition and `/readyz?verbose`."""

    def ejection(self, name: str, endpoint: str, reason: str) -> None: ...


class Quarantined(Protocol):
    """The APIServices left out of discovery and OpenAPI now (`availability/quarantine.py`): the
    control's book, or a worker's copy of it. Immutable: a change is a new set."""

    @property
    def quarantined(self) -> frozenset[str]: ...


class Recheck(Protocol):
    """A request could not reach this APIService's backend: check its availability again now.

    Implementations rate-limit per APIService, so callers may call it on every failure; names that
    are not APIServices (the delegate's `kube-apiserver`) are ignored.
    """

    def suspect(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class FetchedResponse:
    """A complete (small) backend answer: status, case-insensitive headers, body bytes."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


class BackendFetcher(Protocol):
    """The gateway's own GETs to an APIService's backend (discovery, OpenAPI).

    Raises `BackendError` (which names the failing hop) when the backend cannot be reached;
    redirects are returned, never followed.
    """

    async def fetch(
        self,
        apiservice: APIService,
        path: str,
        *,
        headers: Mapping[str, str],
        user: UserInfo,
        timeout: float,  # noqa: ASYNC109 - the backend call enforces it with its own deadline
    ) -> FetchedResponse: ...
