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
from typing import Any

from multidict import CIMultiDict

from aggregator.audit.recorder import (
    AUDIT,
    AUDIT_ID_RESPONSE_HEADER,
    AUTHORIZATION_DECISION,
    Auditor,
    AuditRequest,
    audit_id,
)
from aggregator.web.context import RequestContext
from aggregator.web.serverrequest import Answer, Response

log = logging.getLogger(__name__)


class RequestAuditing:
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    def gate(self, ctx: RequestContext) -> None:
        """After authentication: RequestReceived, for the policy's level (None writes nothing)."""
        info = ctx.info
        if info is None:
            return  # authorization answers it with upstream's 500
        record = self.auditor.begin(ctx, ctx.user, info)
        if record is not None:
            AUDIT.set(ctx, record)

    def head_going_out(self, ctx: RequestContext, status: int, headers: CIMultiDict[str]) -> None:
        if AUDIT_ID_RESPONSE_HEADER not in headers:
            headers[AUDIT_ID_RESPONSE_HEADER] = audit_id(ctx)
        record = AUDIT.get(ctx)
        if record is not None:
            _learn(ctx, record)
            record.response_started(status)

    def finished(self, ctx: RequestContext, answer: Answer | None, error: BaseException | None) -> None:
        record = AUDIT.get(ctx)
        status = answer.status_object if isinstance(answer, Response) else None
        if record is None:
            if answer is not None and ctx.user is None and answer.status in (400, 401):
                self._failed_before_authentication(ctx, answer.status, status)
            return
        _learn(ctx, record)
        if error is not None:
            record.panic(str(error) or type(error).__name__)
        elif answer is None:
            record.complete(ctx.status)
        else:
            record.complete(answer.status, status)

    def _failed_before_authentication(self, ctx: RequestContext, code: int, status: dict[str, Any] | None) -> None:
        """401 from authentication, or 400 from the request deadline: one ResponseStarted event."""
        if ctx.info is None:
            return
        self.auditor.failed_authentication(ctx, ctx.info, code=code, status=status)


def _learn(ctx: RequestContext, record: AuditRequest) -> None:
    """What the gates after the audit found out: who is impersonated, what authorization said."""
    if ctx.requester is not None and ctx.user is not None:
        record.impersonated(ctx.user)
    decision = AUTHORIZATION_DECISION.get(ctx)
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
