"""`/healthz`, `/livez` and `/readyz` as kube-apiserver serves them.

Components register named checks; the wire format (`[+]name ok`, `[-]name failed: reason withheld`,
`?verbose`, `?exclude=`) is upstream's `healthz.handleRootHealth`, so probes and scripts written for
kube-apiserver read ours unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from aggregator.web.context import Handler, RequestContext
from aggregator.web.serverrequest import Response

log = logging.getLogger(__name__)

# A check returns None when healthy, or the (logged, never served) reason it is not.
Check = Callable[[], str | None]
# Extra lines shown in the verbose output of a passing endpoint (e.g. unavailable APIServices).
Notes = Callable[[], list[str]]
# A line's place on a `NoteBoard`: (section, subject); lines read in this order.
NoteKey = tuple[int, str]

ENDPOINTS = ("healthz", "livez", "readyz")


class NoteBoard:
    """Verbose lines kept up to date as their subjects change, instead of rebuilt from every subject
    at each read: one line per key, read in key order. Listeners hear of every line set or removed,
    so a worker process holds the same lines without anything walking them on a timer
    (`workers/publisher.py`). A `Notes` callable like any other."""

    def __init__(self) -> None:
        self._lines: dict[NoteKey, str] = {}
        self._ordered: list[str] | None = []
        self._listeners: list[Callable[[NoteKey, str | None], None]] = []

    def set(self, key: NoteKey, line: str | None) -> None:
        """Show `line` under `key` (None: remove it)."""
        if line is None:
            if self._lines.pop(key, None) is None:
                return
        elif self._lines.get(key) == line:
            return
        else:
            self._lines[key] = line
        self._ordered = None
        for listener in self._listeners:
            listener(key, line)

    def __call__(self) -> list[str]:
        if self._ordered is None:
            self._ordered = [self._lines[key] for key in sorted(self._lines)]
        return list(self._ordered)

    def items(self) -> dict[NoteKey, str]:
        return dict(self._lines)

    def add_listener(self, listener: Callable[[NoteKey, str | None], None]) -> None:
        """Called with (key, line) whenever a line is set, or (key, None) when it is removed."""
        self._listeners.append(listener)


@dataclass(frozen=True)
class _Registered:
    name: str
    check: Check
    endpoints: frozenset[str]


class HealthChecks:
    """Named checks per endpoint; `healthz` carries every check, like upstream."""

    def __init__(self) -> None:
        self._checks: list[_Registered] = []
        self._notes: dict[str, list[Notes]] = {e: [] for e in ENDPOINTS}

    def add(self, name: str, check: Check, *, livez: bool = True, readyz: bool = True) -> None:
        endpoints = {"healthz"}
        if livez:
            endpoints.add("livez")
        if readyz:
            endpoints.add("readyz")
        self._checks.append(_Registered(name, check, frozenset(endpoints)))

    def add_notes(self, endpoint: str, notes: Notes) -> None:
        self._notes[endpoint].append(notes)

    def notes(self, endpoint: str) -> list[str]:
        """The extra verbose lines of `endpoint` now."""
        return [line for notes in self._notes[endpoint] for line in notes()]

    def note_sources(self, endpoint: str) -> list[Notes]:
        """What adds lines to `endpoint`, in order (a worker process shows its control's)."""
        return list(self._notes[endpoint])

    def checks_for(self, endpoint: str) -> list[_Registered]:
        return [c for c in self._checks if endpoint in c.endpoints]

    def handler(self, endpoint: str) -> Handler:
        """Serves `/<endpoint>` and `/<endpoint>/<check>`."""

        async def handle(ctx: RequestContext) -> Response:
            name = ctx.path[len(endpoint) + 2 :]
            return self._single(endpoint, name) if name else self._root(endpoint, ctx)

        return handle

    def _root(self, endpoint: str, ctx: RequestContext) -> Response:
        excluded = set(ctx.query.get("exclude", ()))
        out: list[str] = []
        failed: list[str] = []
        for registered in self.checks_for(endpoint):
            if registered.name in excluded:
                excluded.discard(registered.name)
                out.append(f"[+]{registered.name} excluded: ok\n")
                continue
            reason = _run(registered)
            if reason is None:
                out.append(f"[+]{registered.name} ok\n")
            else:
                out.append(f"[-]{registered.name} failed: reason withheld\n")
                failed.append(f"{registered.name}: {reason}")
        if excluded:
            quoted = ", ".join(f'"{name}"' for name in sorted(excluded))
            out.append(f"warn: some health checks cannot be excluded: no matches for {quoted}\n")
        if failed:
            log.info("%s check failed: %s", endpoint, "; ".join(failed))
            out.append(f"{endpoint} check failed\n")
            # http.Error appends a newline of its own.
            return _text("".join(out) + "\n", 500)
        if "verbose" not in ctx.query:
            return _text("ok", 200)
        for notes in self._notes[endpoint]:
            out.extend(f"{line}\n" for line in notes())
        out.append(f"{endpoint} check passed\n")
        return _text("".join(out), 200)

    def _single(self, endpoint: str, name: str) -> Response:
        for registered in self.checks_for(endpoint):
            if registered.name == name:
                reason = _run(registered)
                if reason is None:
                    return _text("ok", 200)
                log.info("%s check %s failed: %s", endpoint, name, reason)
                return _text(f"internal server error: {reason}\n", 500)
        return _text("404 page not found\n", 404)


def _run(registered: _Registered) -> str | None:
    try:
        return registered.check()
    except Exception as err:  # a broken check must fail, not crash the endpoint
        return f"check raised {type(err).__name__}: {err}"


def _text(body: str, status: int) -> Response:
    return Response(
        status,
        body.encode(),
        {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"},
    )
