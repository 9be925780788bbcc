"""Which endpoints the proxy holds ejected, per APIService, as the checker words them.

Ejection is passive and per serving process (`proxy/endpoints.py`): the proxy of one process, or
each worker over its channel, reports every ejection and return here (`contracts.EjectionReport`).
The checker appends the ejected endpoints and why to the APIService's Available condition message
and to `/readyz?verbose`, so an operator sees a dead replica before the EndpointSlice does; an
endpoint stays listed while any process holds it ejected.
"""

from __future__ import annotations

from collections.abc import Callable

# How the condition message names them (`aggregator check` looks for it in the stored condition).
EJECTED = "ejected endpoints: "


class EjectionBook:
    def __init__(self) -> None:
        # APIService -> endpoint -> source (a worker's index, or "" for this process) -> reason
        self._ejected: dict[str, dict[str, dict[str, str]]] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._described: list[Callable[[str, str | None], None]] = []

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Told the APIService's name whenever its set of ejected endpoints changes."""
        self._listeners.append(listener)

    def add_description_listener(self, listener: Callable[[str, str | None], None]) -> None:
        """Told (name, `describe(name)`) whenever that description changes (a reason too)."""
        self._described.append(listener)

    def ejection(self, name: str, endpoint: str, reason: str, source: str = "") -> None:
        """`contracts.EjectionReport`: ejected for `reason`, or back when `reason` is empty."""
        before = self.describe(name) if self._described else None
        endpoints = self._ejected.setdefault(name, {})
        sources = endpoints.setdefault(endpoint, {})
        if reason:
            changed = not sources
            sources[source] = reason
        else:
            sources.pop(source, None)
            changed = not sources
            if not sources:
                del endpoints[endpoint]
            if not endpoints:
                del self._ejected[name]
        if changed:
            for listener in self._listeners:
                listener(name)
        if self._described:
            after = self.describe(name)
            if after != before:
                for described in self._described:
                    described(name, after)

    def forget_source(self, source: str) -> None:
        """A worker is gone: what it held ejected no longer counts."""
        for name in list(self._ejected):
            for endpoint in list(self._ejected.get(name, {})):
                if source in self._ejected[name][endpoint]:
                    self.ejection(name, endpoint, "", source)

    def describe(self, name: str) -> str | None:
        """`ejected endpoints: 10.0.0.5:443 (dial tcp ...: connect: connection refused)`, or None."""
        endpoints = self._ejected.get(name)
        if not endpoints:
            return None
        listed = ", ".join(
            f"{endpoint} ({next(iter(sources.values()))})" for endpoint, sources in sorted(endpoints.items())
        )
        return f"{EJECTED}{listed}"
