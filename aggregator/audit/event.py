"""One audit event and its JSON line, byte-compatible with kube-apiserver's log backend.

Fields and their order are `k8s.io/apiserver/pkg/apis/audit/v1/types.go Event` with the same
`omitempty` rules, so tools written for kube-apiserver's audit log (jq filters, Falco's k8saudit,
SIEM parsers) read ours unchanged. What goes into the fields follows `pkg/audit/request.go
LogRequestMetadata` (source IPs, truncated user agent, objectRef from RequestInfo) and
`pkg/audit/context.go` (responseStatus, impersonatedUser). Encoding happens on the writer thread.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aggregator.audit.body import CapturedBody, DecodedBody, decode_body
from aggregator.audit.policy import API_VERSION, Level, Stage
from aggregator.model.userinfo import UserInfo
from aggregator.wire.jsonenc import go_marshal

MAX_USER_AGENT_LENGTH = 1024
USER_AGENT_TRUNCATE_SUFFIX = "...TRUNCATED"
# Annotations saying why a body the level asks for is not in the event.
REQUEST_OBJECT_ANNOTATION = "aggregator/request-object"
RESPONSE_OBJECT_ANNOTATION = "aggregator/response-object"

_SURROGATES = re.compile("[\ud800-\udfff]")
_SOCKET_IPV4 = re.compile(
    r"(?:[1-9]?\d|1\d\d|2[0-4]\d|25[0-5])(?:\.(?:[1-9]?\d|1\d\d|2[0-4]\d|25[0-5])){3}", re.ASCII
)


def micro_time(moment: datetime) -> str:
    """`metav1.MicroTime` in JSON: RFC 3339 in UTC with exactly six fractional digits."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def go_string(text: str) -> str:
    """A header-derived string as Go's JSON encoder writes it: each byte that was not valid UTF-8
    (aiohttp keeps them as lone surrogates) becomes U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def truncate_user_agent(user_agent: str) -> str:
    """`maybeTruncateUserAgent`: at most 1024 bytes, then `...TRUNCATED`."""
    raw = user_agent.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_USER_AGENT_LENGTH:
        return go_string(user_agent)
    cut = raw[:MAX_USER_AGENT_LENGTH].decode("utf-8", "surrogateescape")
    return go_string(cut) + USER_AGENT_TRUNCATE_SUFFIX


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Go's `net.ParseIP`: no zone, and an IPv4-mapped IPv6 address is the IPv4 address."""
    if "%" in text:
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def source_ips(forwarded_for: str | None, real_ip: str | None, remote: str | None) -> tuple[str, ...]:
    """`utilnet.SourceIPs`: the valid `X-Forwarded-For` entries, `X-Real-Ip` unless already listed,
    then the peer address unless it is already last. The peer is the only entry a client cannot forge."""
    if not forwarded_for and not real_ip and remote and _SOCKET_IPV4.fullmatch(remote):
        return (remote,)  # the common case, kept cheap: a socket's IPv4 address is in Go's form
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for part in (forwarded_for or "").split(","):
        if (ip := _parse_ip(part.strip())) is not None:
            ips.append(ip)
    if real_ip and (ip := _parse_ip(real_ip)) is not None and ip not in ips:
        ips.append(ip)
    if remote and (ip := _parse_ip(remote)) is not None and (not ips or ips[-1] != ip):
        ips.append(ip)
    return tuple(str(ip) for ip in ips)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """`audit.ObjectReference`."""

    resource: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    api_group: str = ""
    api_version: str = ""
    resource_version: str = ""
    subresource: str = ""

    def document(self) -> dict[str, str]:
        pairs = (
            ("resource", self.resource),
            ("namespace", self.namespace),
            ("name", self.name),
            ("uid", self.uid),
            ("apiGroup", self.api_group),
            ("apiVersion", self.api_version),
            ("resourceVersion", self.resource_version),
            ("subresource", self.subresource),
        )
        return {key: value for key, value in pairs if value}


@dataclass(frozen=True, slots=True)
class ResponseStatus:
    """The bounded copy of a `metav1.Status` that events carry (`AuditContext.LogResponseObject`)."""

    code: int = 0
    status: str = ""
    message: str = ""
    reason: str = ""
    details: Mapping[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        # ListMeta is a struct: `omitempty` never drops it, hence the constant `"metadata":{}`.
        doc: dict[str, Any] = {"metadata": {}}
        if self.status:
            doc["status"] = self.status
        if self.message:
            doc["message"] = self.message
        if self.reason:
            doc["reason"] = self.reason
        if self.details is not None:
            doc["details"] = self.details
        if self.code:
            doc["code"] = self.code
        return doc


def user_document(user: UserInfo | None) -> dict[str, Any]:
    """`authenticationv1.UserInfo`: every field `omitempty`; extra keys sorted as Go sorts map keys."""
    doc: dict[str, Any] = {}
    if user is None:
        return doc
    if user.name:
        doc["username"] = go_string(user.name)
    if user.uid:
        doc["uid"] = go_string(user.uid)
    if user.groups:
        doc["groups"] = [go_string(g) for g in user.groups]
    if user.extra:
        doc["extra"] = {go_string(k): [go_string(v) for v in user.extra[k]] for k in sorted(user.extra)}
    return doc


@dataclass(frozen=True, slots=True)
class Event:
    """One stage of one request. Immutable: each stage is a `dataclasses.replace` of the last."""

    level: Level
    audit_id: str
    stage: Stage
    request_uri: str
    verb: str
    user: UserInfo | None
    request_received: datetime
    stage_timestamp: datetime
    impersonated_user: UserInfo | None = None
    source_ips: tuple[str, ...] = ()
    user_agent: str = ""
    object_ref: ObjectRef | None = None
    response_status: ResponseStatus | None = None
    request_body: CapturedBody | None = None
    response_body: CapturedBody | None = None
    omit_managed_fields: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)


def _fill_object_ref(ref: ObjectRef, obj: Any) -> ObjectRef:
    """`LogRequestObject`: take namespace, name, uid and resourceVersion from the request object
    where RequestInfo had none (a create names its object only in the body)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ref

    def pick(current: str, key: str) -> str:
        value = meta.get(key)
        return current or (value if isinstance(value, str) else "")

    return ObjectRef(
        ref.resource,
        pick(ref.namespace, "namespace"),
        pick(ref.name, "name"),
        pick(ref.uid, "uid"),
        ref.api_group,
        ref.api_version,
        pick(ref.resource_version, "resourceVersion"),
        ref.subresource,
    )


def _body_object(
    event: Event, body: CapturedBody | None, annotation: str, annotations: dict[str, str]
) -> DecodedBody | None:
    """A captured request or response body as the event's object, or None; when it was left out
    (too large, not JSON, ...), the annotation saying why."""
    decoded = decode_body(body, omit_managed_fields=event.omit_managed_fields) if body is not None else None
    if decoded is not None and decoded.omitted:
        annotations.setdefault(annotation, decoded.omitted)
        return None
    return decoded


def event_document(event: Event) -> dict[str, Any]:
    """The event as an ordered dict in `audit/v1.Event` field order."""
    annotations = dict(event.annotations)
    object_ref = event.object_ref
    request_object = _body_object(event, event.request_body, REQUEST_OBJECT_ANNOTATION, annotations)
    response_object = _body_object(event, event.response_body, RESPONSE_OBJECT_ANNOTATION, annotations)
    if request_object is not None and object_ref is not None:
        object_ref = _fill_object_ref(object_ref, request_object.value)

    doc: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": API_VERSION,
        "level": event.level.value,
        "auditID": go_string(event.audit_id),
        "stage": event.stage.value,
        "requestURI": go_string(event.request_uri),
        "verb": event.verb,
        "user": user_document(event.user),
    }
    if event.impersonated_user is not None:
        doc["impersonatedUser"] = user_document(event.impersonated_user)
    if event.source_ips:
        doc["sourceIPs"] = list(event.source_ips)
    if event.user_agent:
        doc["userAgent"] = event.user_agent
    if object_ref is not None:
        doc["objectRef"] = object_ref.document()
    if event.response_status is not None:
        doc["responseStatus"] = event.response_status.document()
    if request_object is not None:
        doc["requestObject"] = request_object.value
    if response_object is not None:
        doc["responseObject"] = response_object.value
    doc["requestReceivedTimestamp"] = micro_time(event.request_received)
    doc["stageTimestamp"] = micro_time(event.stage_timestamp)
    if annotations:
        doc["annotations"] = {key: annotations[key] for key in sorted(annotations)}
    return doc


def encode_event(event: Event) -> bytes:
    """One JSON line, as the log backend writes it (`runtime.Encode` output ends in a newline)."""
    doc = event_document(event)
    try:
        return go_marshal(doc) + b"\n"
    except UnicodeEncodeError:
        # A body decoded from JSON may hold an unpaired `\ud800` escape; Go writes U+FFFD for it.
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        return go_marshal(json.loads(_SURROGATES.sub("\ufffd", text))) + b"\n"
