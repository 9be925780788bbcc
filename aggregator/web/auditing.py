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

from aggregator.audit.body import BodyCapture
from aggregator.audit.recorder import AUDIT_ID_RESPONSE_HEADER, Auditor, AuditRequest, audit_id
from aggregator.web.context import get_authorization, get_requester, get_user
from aggregator.web.lifecycle import get_state
from aggregator.web.requestinfo import RequestInfoError, request_info
from aggregator.web.responses import STATUS
from aggregator.web.routing import Route

log = logging.getLogger(__name__)

RECORD = web.RequestKey("aggregator.audit", AuditRequest)


class RequestAuditing:
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    async def gate(self, request: web.Request, route: Route) -> web.StreamResponse | None:
        """After authentication: RequestReceived, for the policy's level (None writes nothing)."""
        try:
            info = request_info(request)
        except RequestInfoError:
            return None  # authorization answers it with upstream's 500
        state = get_state(request)
        record = self.auditor.begin(
            request, get_user(request), info, long_running=state.long_running if state is not None else None
        )
        if record is not None:
            request[RECORD] = record
        return None

    def head_going_out(self, request: web.Request, status: int, response: web.StreamResponse | None) -> None:
        if response is not None and AUDIT_ID_RESPONSE_HEADER not in response.headers:
            response.headers[AUDIT_ID_RESPONSE_HEADER] = audit_id(request)
        record = request.get(RECORD)
        if record is not None:
            _learn(request, record)
            record.response_started(status)

    def finished(
        self, request: web.Request, response: web.StreamResponse | None, error: BaseException | None
    ) -> None:
        record = request.get(RECORD)
        if record is None:
            if response is not None and get_user(request) is None and response.status in (400, 401):
                self._failed_before_authentication(request, response)
            return
        _learn(request, record)
        if error is not None:
            record.panic(str(error) or type(error).__name__)
        elif response is None:
            state = get_state(request)
            record.complete(state.status if state is not None else None)
        else:
            record.complete(response.status, response.get(STATUS))

    def _failed_before_authentication(self, request: web.Request, response: web.StreamResponse) -> None:
        """401 from authentication, or 400 from the request deadline: one ResponseStarted event."""
        try:
            info = request_info(request)
        except RequestInfoError:
            return
        self.auditor.failed_authentication(request, info, code=response.status, status=response.get(STATUS))


def _learn(request: web.Request, record: AuditRequest) -> None:
    """What the gates after the audit found out: who is impersonated, what authorization said."""
    if get_requester(request) is not None:
        user = get_user(request)
        if user is not None:
            record.impersonated(user)
    decision = get_authorization(request)
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


def request_body_tap(request: web.Request) -> BodyCapture | None:
    """The audit's copy of the request body, when the policy's level records it (Request and above)."""
    record = request.get(RECORD)
    return record.request_capture() if record is not None else None


def response_body_tap(request: web.Request, content_type: str, content_encoding: str) -> BodyCapture | None:
    """The audit's copy of the response body, at level RequestResponse."""
    record = request.get(RECORD)
    return record.response_capture(content_type, content_encoding) if record is not None else None
