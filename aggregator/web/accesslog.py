"""Which requests get an access-log line: `--access-log` (off | errors | sampled[:N] | all).

One formatted line per request costs more than some requests themselves, so the default logs only
the failures the gateway must explain (5xx, clients that went away, and proxied requests that
were retried on another endpoint: their line names the endpoint that answered and why the first
attempt failed, `endpoint` and `retried`); `-v 3` and above logs
every request, as kube-apiserver's httplog does at verbosity 3 (`WithLogging`'s `klog.V(3)`).
`sampled:N` logs one request in N plus every failure. Lines are written by the logging thread
(`util/logs.py`), never on the event loop.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from aggregator.util.logs import ACCESS_LOGGER, fields
from aggregator.web.context import RequestContext

log = logging.getLogger(ACCESS_LOGGER)

MODES = ("off", "errors", "sampled", "all")
DEFAULT_SAMPLE = 100
# A client that closed the connection before the answer was written.
CLIENT_GONE = 499
# The access-log field of a request that was retried on another endpoint (`RequestContext.log_fields`):
# its line is written in every mode but off.
RETRIED = "retried"


class AccessLogError(ValueError):
    """A `--access-log` value that is not one of the modes."""


@dataclass(frozen=True)
class AccessLogPolicy:
    mode: str
    every: int = DEFAULT_SAMPLE  # sampled: one request in `every`

    @classmethod
    def parse(cls, text: str | None, *, verbosity: int = 0) -> AccessLogPolicy:
        """`None` means the default for the verbosity (errors, or all from -v 3)."""
        if text is None or text == "":
            return cls("all" if verbosity >= 3 else "errors")
        mode, _, every = text.partition(":")
        if mode not in MODES or (every and mode != "sampled"):
            raise AccessLogError(f"{text!r} is not one of off, errors, sampled[:N], all")
        if every:
            if not every.isdigit() or int(every) < 1:
                raise AccessLogError(f"{text!r}: N must be a positive integer")
            return cls(mode, int(every))
        return cls(mode)


class AccessLog:
    """Decides per request, cheaply, and writes the line when the policy asks for it."""

    def __init__(self, policy: AccessLogPolicy) -> None:
        self.policy = policy
        self._mode = policy.mode
        self._counter = itertools.count()

    def wanted(self, code: int) -> bool:
        mode = self._mode
        if mode == "all":
            return True
        if mode == "off":
            return False
        if code >= 500 or code == CLIENT_GONE:
            return True
        return mode == "sampled" and next(self._counter) % self.policy.every == 0

    def record(self, ctx: RequestContext, code: int) -> None:
        extra = ctx.log_fields
        if not (self.wanted(code) or (extra is not None and RETRIED in extra and self._mode != "off")):
            return
        if not log.isEnabledFor(logging.INFO):
            return
        user = ctx.user
        values = fields(
            method=ctx.method,
            path=ctx.path,
            status=code,
            duration_ms=round((time.monotonic() - ctx.received) * 1000, 2),
            user=user.name if user is not None else "",
            route=ctx.route.name,
            remote=ctx.remote or "",
            protocol=ctx.connection.protocol,
        )
        if extra is not None:
            values["fields"].update(extra)
        log.info("request", extra=values)
