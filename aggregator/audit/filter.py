"""The audit in the request path: where kube-apiserver's audit filters sit, and what they see.

- `gate`, right after authentication (`filters/audit.go WithAudit` follows `WithAuthentication`):
  the policy is evaluated for the authenticated user and RequestReceived is written.
- `head_going_out`, when a status line is written (`auditResponseWriter.processCode`, `Hijack`
  for a 101): the code is recorded, and long-running requests get ResponseStarted. Every answer
  also carries `Audit-Id` (`filters/audit_init.go WithAuditInit`), unless it has one already (a
  backend's answer echoing the ID the gateway passed on).
- `finished`, at the end: ResponseComplete (with the Status the gateway wrote, if it wrote one,
  as `LogResponseObject` records it), or Panic; the impersonated user and the authorization
  decision are copied in first. A request that failed authentication gets the single
  ResponseStarted event of `WithFailedAuthenticationAudit`; one refused for a bad `?timeout=`
  that of `request_deadline.go withFailedRequestAudit`.

Every call builds an immutable event and queues it (`Auditor`): nothing here waits.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from aggregator.audit.recorder import AUDIT_ID_RESPONSE_HEADER, Auditor, AuditRequest, audit_id
from aggregator.web.context import RequestContext
from aggregator.web.responses import STATUS

log = logging.getLogger(__name__)


class RequestAuditing:
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    def gate(self, ctx: RequestContext) -> None:
        """After authentication: RequestReceived, for the policy's level (None writes nothing)."""
        info = ctx.info
        if info is None:
            return  # authorization answers it with upstream's 500
        ctx.audit = self.auditor.begin(ctx, ctx.user, info)

    def head_going_out(self, ctx: RequestContext, status: int, response: web.StreamResponse | None) -> None:
        if response is not None and AUDIT_ID_RESPONSE_HEADER not in response.headers:
            response.headers[AUDIT_ID_RESPONSE_HEADER] = audit_id(ctx)
        record = _record(ctx)
        if record is not None:
            _learn(ctx, record)
            record.response_started(status)

    def finished(
        self, ctx: RequestContext, response: web.StreamResponse | None, error: BaseException | None
    ) -> None:
        record = _record(ctx)
        if record is None:
            if response is not None and ctx.user is None and response.status in (400, 401):
                self._failed_before_authentication(ctx, response)
            return
        _learn(ctx, record)
        if error is not None:
            record.panic(str(error) or type(error).__name__)
        elif response is None:
            record.complete(ctx.status)
        else:
            record.complete(response.status, response.get(STATUS))

    def _failed_before_authentication(self, ctx: RequestContext, response: web.StreamResponse) -> None:
        """401 from authentication, or 400 from the request deadline: one ResponseStarted event."""
        if ctx.info is None:
            return
        self.auditor.failed_authentication(ctx, ctx.info, code=response.status, status=response.get(STATUS))


def _record(ctx: RequestContext) -> AuditRequest | None:
    record = ctx.audit
    return record if isinstance(record, AuditRequest) else None


def _learn(ctx: RequestContext, record: AuditRequest) -> None:
    """What the gates after the audit found out: who is impersonated, what authorization said."""
    if ctx.requester is not None and ctx.user is not None:
        record.impersonated(ctx.user)
    decision = ctx.authorization
    if decision is not None:
        record.authorized(*decision)


class AuditLog:
    """The Auditor as a component: its writer thread starts with the gateway and, stopped last,
    writes out every queued event before the log is closed (off the event loop: it may wait for
    the disk)."""

    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    async def start(self) -> None:
        self.auditor.start()

    async def stop(self) -> None:
        if not await asyncio.to_thread(self.auditor.stop):
            log.warning("the audit log writer did not finish in time; queued events may be lost")
