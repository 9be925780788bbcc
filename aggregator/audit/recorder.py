"""The request pipeline's side of auditing: a small synchronous API that never waits.

`Auditor.begin` evaluates the policy for the authenticated user and the request's RequestInfo and
writes the RequestReceived event (`filters/audit.go WithAudit`, `evaluatePolicyAndCreateAuditEvent`,
`audit.LogRequestMetadata`); the returned `AuditRequest` then records what the pipeline learns
(impersonation, authorization annotations, bodies) and writes the later stages: ResponseStarted
for long-running requests when the status code is known, ResponseComplete at the end, or Panic.
Every call only builds an immutable Event and hands it to the writer's bounded queue.
"""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from aggregator.audit.body import DEFAULT_BODY_LIMIT, BodyCapture
from aggregator.audit.event import (
    Event,
    ObjectRef,
    ResponseStatus,
    go_string,
    source_ips,
    truncate_user_agent,
)
from aggregator.audit.policy import Level, Policy, Stage
from aggregator.audit.sinks import utc_now
from aggregator.model.userinfo import UserInfo
from aggregator.web.context import ContextKey, RequestContext
from aggregator.web.metrics import Families
from aggregator.web.requestinfo import RequestInfo

log = logging.getLogger(__name__)

AUDIT_ID_HEADER = "Audit-ID"
# Go's Header.Set canonicalises the name: this is how kube-apiserver's answers spell it.
AUDIT_ID_RESPONSE_HEADER = "Audit-Id"

# `filters/authorization.go`: the annotations kube-apiserver adds to every authorized request.
DECISION_ANNOTATION = "authorization.k8s.io/decision"
REASON_ANNOTATION = "authorization.k8s.io/reason"

# The request's audit ID (`WithAuditInit`), fixed once read.
AUDIT_ID = ContextKey[str]("audit-id")
# What authorization decided and why (`filters/authorization.go` adds them as audit annotations).
AUTHORIZATION_DECISION = ContextKey[tuple[bool, str]]("authorization-decision")

_FINAL_STAGES = frozenset({Stage.RESPONSE_COMPLETE, Stage.PANIC})
# (group, resource, subresource) whose bodies carry credentials: never captured, at any level.
_SENSITIVE = frozenset(
    {
        ("", "secrets", ""),
        ("authentication.k8s.io", "tokenreviews", ""),
        ("", "serviceaccounts", "token"),
    }
)


class AuditMetrics:
    """k8s.io/apiserver's audit counters, with upstream's names and help text
    (pkg/audit/metrics.go: `eventCounter`, `errorCounter`, `levelCounter`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        family = Families(registry)
        self.events = family.counter(
            "apiserver_audit_event",
            "[ALPHA] Counter of audit events generated and sent to the audit backend.",
        )
        self.errors = family.counter(
            "apiserver_audit_error",
            "[ALPHA] Counter of audit events that failed to be audited properly. Plugin identifies the "
            "plugin affected by the error.",
            ["plugin"],
        )
        self.levels = family.counter(
            "apiserver_audit_level",
            "[ALPHA] Counter of policy levels for audit events (1 per request).",
            ["level"],
        )


class EventWriter(Protocol):
    def submit(self, event: Event | bytes) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> bool: ...

    def wait_idle(self, timeout: float) -> bool: ...


def new_audit_id() -> str:
    return str(uuid.uuid4())


def audit_id(ctx: RequestContext, new_id: Callable[[], str] = new_audit_id) -> str:
    """`WithAuditInit`: the caller's `Audit-ID` header as sent (no truncation), else a new UUIDv4;
    fixed for the request's lifetime (`AUDIT_ID`)."""
    value = AUDIT_ID.get(ctx)
    if value is None:
        value = ctx.headers.get(AUDIT_ID_HEADER) or new_id()
        AUDIT_ID.set(ctx, value)
    return value


def request_uri(ctx: RequestContext) -> str:
    """`URL.RequestURI()`: the request target as sent, path and query, without a fragment.

    One deliberate difference: an `access_token` query value (a bearer token some clients put in
    URLs; the gateway never accepts it) is replaced by `REDACTED`, so a credential never reaches
    the log even when it is sent where it does not belong.
    """
    target = ctx.target
    if not target.startswith("/"):
        target = ctx.raw_path + ("?" + ctx.raw_query if ctx.raw_query else "")
    target = target.split("#", 1)[0]
    path, sep, query = target.partition("?")
    if "access_token" not in query:
        return target
    params = [
        "access_token=REDACTED" if p.split("=", 1)[0] == "access_token" else p for p in query.split("&")
    ]
    return path + sep + "&".join(params)


def _auth_methods(ctx: RequestContext) -> str:
    """`getAuthMethods`: which kinds of credential were tried, never the credential."""
    methods = []
    auth = ctx.headers.get("Authorization", "").strip()
    scheme, _, rest = auth.partition(" ")
    if scheme.lower() == "basic":
        try:
            if b":" in base64.b64decode(rest.strip(), validate=True):
                methods.append("basic")
        except (binascii.Error, ValueError):
            pass
    parts = auth.split(" ")
    if len(parts) > 1 and parts[0].lower() == "bearer":
        methods.append("bearer")
    if (ctx.query.get("access_token") or [""])[0].strip():
        methods.append("access_token")
    ssl_object = ctx.connection.ssl_object
    if ssl_object is not None and ssl_object.getpeercert(binary_form=True):
        methods.append("x509")
    if methods:
        return "Authentication failed, attempted: " + ", ".join(methods)
    return "Authentication failed, no credentials provided"


def _status_from(status: Mapping[str, Any], code: int) -> ResponseStatus:
    """The bounded copy `LogResponseObject` keeps of a Status the gateway answered with."""
    details = status.get("details")
    return ResponseStatus(
        code=int(status.get("code") or code),
        status=str(status.get("status") or ""),
        message=str(status.get("message") or ""),
        reason=str(status.get("reason") or ""),
        details=details if isinstance(details, Mapping) else None,
    )


class Auditor:
    """Policy evaluation plus event emission for the whole gateway; one per process."""

    def __init__(
        self,
        policy: Policy,
        writer: EventWriter,
        metrics: AuditMetrics,
        *,
        body_limit: int = DEFAULT_BODY_LIMIT,
        now: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] = new_audit_id,
    ) -> None:
        self.policy = policy
        self.writer = writer
        self.body_limit = body_limit
        self._now = now
        self._new_id = new_id
        self._events = metrics.events
        self._levels = {level: metrics.levels.labels(level.value) for level in Level}

    def start(self) -> None:
        self.writer.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Write every queued event and close the log (upstream shuts the backend down after the
        in-flight requests drained). False if the writer did not finish within `timeout`."""
        return self.writer.stop(timeout)

    def wait_idle(self, timeout: float) -> bool:
        return self.writer.wait_idle(timeout)

    def begin(
        self,
        ctx: RequestContext,
        user: UserInfo | None,
        info: RequestInfo,
        *,
        received: datetime | None = None,
    ) -> AuditRequest | None:
        """Call once the user is authenticated (before impersonation and authorization), as
        kube-apiserver's audit filter sits. None when the policy says level None."""
        config = self.policy.evaluate(user, info)
        self._levels[config.level].inc()
        if config.level is Level.NONE:
            return None
        event = self._base_event(ctx, user, info, config.level, received, config.omit_managed_fields)
        # No body is copied from a long-running request (a watch, a tunnel: `ctx.long_running`).
        audit = AuditRequest(
            self,
            event,
            config.omit_stages,
            long_running=ctx.long_running,
            capture=not ctx.long_running,
            sensitive=(info.api_group, info.resource, info.subresource) in _SENSITIVE,
            request_content_type=ctx.headers.get("Content-Type", ""),
            request_content_encoding=ctx.headers.get("Content-Encoding", ""),
        )
        audit._process(Stage.REQUEST_RECEIVED)
        return audit

    def failed_authentication(
        self,
        ctx: RequestContext,
        info: RequestInfo,
        *,
        code: int = 401,
        status: Mapping[str, Any] | None = None,
    ) -> None:
        """`WithFailedAuthenticationAudit`: one ResponseStarted event with an empty user, and the
        kinds of credential that were tried. Pass the Status the gateway answers with, if any."""
        config = self.policy.evaluate(None, info)
        self._levels[config.level].inc()
        if config.level is Level.NONE:
            return
        event = self._base_event(ctx, None, info, config.level, None, False)
        if status is not None:
            answer = replace(_status_from(status, code), code=code)
        else:
            answer = ResponseStatus(code=code, message=_auth_methods(ctx))
        event = replace(event, response_status=answer)
        if Stage.RESPONSE_STARTED not in config.omit_stages:
            self.emit(replace(event, stage=Stage.RESPONSE_STARTED, stage_timestamp=self._now()))

    def _base_event(
        self,
        ctx: RequestContext,
        user: UserInfo | None,
        info: RequestInfo,
        level: Level,
        received: datetime | None,
        omit_managed_fields: bool,
    ) -> Event:
        """`LogRequestMetadata`."""
        received = received or self._now()
        headers = ctx.headers
        object_ref = None
        if info.is_resource_request:
            object_ref = ObjectRef(
                resource=info.resource,
                namespace=info.namespace,
                name=info.name,
                api_group=info.api_group,
                api_version=info.api_version,
                subresource=info.subresource,
            )
        return Event(
            level=level,
            audit_id=audit_id(ctx, self._new_id),
            stage=Stage.REQUEST_RECEIVED,
            request_uri=request_uri(ctx),
            verb=info.verb,
            user=user,
            request_received=received,
            stage_timestamp=received,
            source_ips=source_ips(headers.get("X-Forwarded-For"), headers.get("X-Real-Ip"), ctx.remote),
            user_agent=truncate_user_agent(headers.get("User-Agent", "")),
            object_ref=object_ref,
            omit_managed_fields=omit_managed_fields,
        )

    def emit(self, event: Event) -> None:
        """`ProcessEventStage`'s last step: count the event and queue it."""
        self._events.inc()
        self.writer.submit(event)

    def now(self) -> datetime:
        return self._now()


class AuditRequest:
    """One audited request. Methods are cheap, synchronous and idempotent where upstream's are
    (the status code is recorded once, the final stage is written once)."""

    __slots__ = (
        "_annotations",
        "_auditor",
        "_base",
        "_capture",
        "_code_recorded",
        "_done",
        "_impersonated",
        "_omit",
        "_request_capture",
        "_response_capture",
        "_sensitive",
        "_status",
        "long_running",
        "request_content_encoding",
        "request_content_type",
    )

    def __init__(
        self,
        auditor: Auditor,
        event: Event,
        omit_stages: frozenset[Stage],
        *,
        long_running: bool,
        capture: bool,
        sensitive: bool,
        request_content_type: str = "",
        request_content_encoding: str = "",
    ) -> None:
        self._auditor = auditor
        self._base = event  # the RequestReceived fields; later stages add to them
        self._impersonated: UserInfo | None = None
        self._annotations: Mapping[str, str] = {}  # copy-on-write: snapshots share it
        self._omit = omit_stages
        self.long_running = long_running
        self._capture = capture
        self._sensitive = sensitive
        self.request_content_type = request_content_type
        self.request_content_encoding = request_content_encoding
        self._request_capture: BodyCapture | None = None
        self._response_capture: BodyCapture | None = None
        self._status: ResponseStatus | None = None
        self._code_recorded = False
        self._done = False

    @property
    def audit_id(self) -> str:
        return self._base.audit_id

    @property
    def level(self) -> Level:
        return self._base.level

    @property
    def event(self) -> Event:
        """The event as it stands (for tests and diagnostics)."""
        return self._snapshot(self._base.stage, self._base.stage_timestamp, final=False)

    def annotate(self, key: str, value: str) -> None:
        """`AddAuditAnnotation`: the first value set for a key stays."""
        current = self._annotations.get(key)
        if current is not None:
            if current != value:
                log.warning("audit annotation %s already set; keeping the first value", key)
            return
        self._annotations = {**self._annotations, key: go_string(value)}

    def authorized(self, allowed: bool, reason: str = "") -> None:
        """The decision annotations kube-apiserver's authorization filter adds."""
        self.annotate(DECISION_ANNOTATION, "allow" if allowed else "forbid")
        self.annotate(REASON_ANNOTATION, reason)

    def impersonated(self, user: UserInfo) -> None:
        """`LogImpersonatedUser`: `user` stays the requester; this is who they act as."""
        self._impersonated = user

    def request_capture(self) -> BodyCapture | None:
        """A tee for the request body at level Request and above; None otherwise and for watches,
        other long-running requests and upgrades. Call `finish()` on it when the body has been sent."""
        if self._capture and not self.level.less(Level.REQUEST) and self._request_capture is None:
            self._request_capture = BodyCapture(
                self._auditor.body_limit,
                content_type=self.request_content_type,
                content_encoding=self.request_content_encoding,
                sensitive=self._sensitive,
            )
        return self._request_capture

    def response_capture(self, content_type: str = "", content_encoding: str = "") -> BodyCapture | None:
        """A tee for the response body at level RequestResponse; None otherwise (and never for
        long-running requests or upgrades). Give it the response's Content-Type and -Encoding."""
        if (
            self._capture
            and self.level is Level.REQUEST_RESPONSE
            and not self._done
            and self._response_capture is None
        ):
            self._response_capture = BodyCapture(
                self._auditor.body_limit,
                content_type=content_type,
                content_encoding=content_encoding,
                sensitive=self._sensitive,
            )
        return self._response_capture

    def response_started(self, code: int) -> None:
        """The status line is going out. For long-running requests this writes ResponseStarted."""
        if self._code_recorded or self._done:
            return
        self._code_recorded = True
        status = self._status
        self._status = replace(status, code=code) if status is not None else ResponseStatus(code=code)
        if self.long_running:
            self._process(Stage.RESPONSE_STARTED)

    def complete(self, code: int | None = None, status: Mapping[str, Any] | None = None) -> None:
        """The response is done (or the connection closed): writes ResponseComplete.

        `status` is the Status object the gateway answered with, if it wrote one itself. With no
        code recorded at all, upstream's `Connection closed early` status is assumed.
        """
        if self._done:
            return
        if status is not None:
            self._status = _status_from(status, code or 0)
        if code is not None:
            self.response_started(code)
        if self._status is None:
            self._status = ResponseStatus(code=200, status="Success", message="Connection closed early")
            if self.long_running:
                self._process(Stage.RESPONSE_STARTED)
        self._code_recorded = True
        self._process(Stage.RESPONSE_COMPLETE)
        self._done = True

    def panic(self, message: str) -> None:
        """The handler failed unexpectedly: writes Panic (instead of ResponseComplete)."""
        if self._done:
            return
        self._status = ResponseStatus(
            code=500, status="Failure", message=f"APIServer panic'd: {message}", reason="InternalError"
        )
        self._process(Stage.PANIC)
        self._done = True

    def _process(self, stage: Stage) -> None:
        """`ProcessEventStage`: stamp, snapshot and queue the event unless the stage is omitted."""
        if stage in self._omit:
            return
        stamp = self._base.request_received if stage is Stage.REQUEST_RECEIVED else self._auditor.now()
        self._auditor.emit(self._snapshot(stage, stamp, final=stage in _FINAL_STAGES))

    def _snapshot(self, stage: Stage, stamp: datetime, *, final: bool) -> Event:
        """An immutable Event for the writer thread (one constructor call: this is the hot path)."""
        base = self._base
        request_tee, response_tee = self._request_capture, self._response_capture
        return Event(
            level=base.level,
            audit_id=base.audit_id,
            stage=stage,
            request_uri=base.request_uri,
            verb=base.verb,
            user=base.user,
            request_received=base.request_received,
            stage_timestamp=stamp,
            impersonated_user=self._impersonated,
            source_ips=base.source_ips,
            user_agent=base.user_agent,
            object_ref=base.object_ref,
            response_status=self._status,
            request_body=request_tee.snapshot() if final and request_tee else None,
            response_body=response_tee.snapshot() if final and response_tee else None,
            omit_managed_fields=base.omit_managed_fields,
            annotations=self._annotations,
        )


# The request's audit record, once the policy chose to audit it (`filter.RequestAuditing.gate`);
# the proxy reads it to capture the bodies it streams.
AUDIT = ContextKey[AuditRequest]("audit")
