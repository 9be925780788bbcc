"""`apiregistration.k8s.io/v1` APIService: decode, default, validate, and condition rules.

Validation reproduces `kube-aggregator/pkg/apis/apiregistration/validation.ValidateAPIService`
error by error, in upstream's order and wording, so an operator sees the message kube-apiserver
would have given them.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aggregator.model import fielderrors as fe
from aggregator.model.decode import DecodeError, int32, mapping, sequence, shared
from aggregator.model.decode import field as decode_field

GROUP = "apiregistration.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "APIService"

AVAILABLE = "Available"
CONDITION_STATUSES = ("True", "False", "Unknown")
LOCAL_REASON = "Local"
LOCAL_MESSAGE = "Local APIServices are always available"


@dataclass(frozen=True, slots=True)
class ServiceReference:
    namespace: str
    name: str
    port: int = 443

    @property
    def server_name(self) -> str:
        """The name a backend certificate must be valid for, whatever address is dialed."""
        return f"{self.name}.{self.namespace}.svc"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    last_transition_time: str | None = None
    reason: str = ""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status}
        if self.last_transition_time:
            out["lastTransitionTime"] = self.last_transition_time
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        return out

    def __reduce__(self) -> tuple[Callable[..., Condition], tuple[str, str, str | None, str, str]]:
        """Unpickled (a worker's copy) with its repeated texts shared: every unavailable
        APIService's condition says `Available`, `False` and the same reason, and thousands
        share a transition second."""
        return _shared_condition, (
            self.type,
            self.status,
            self.last_transition_time,
            self.reason,
            self.message,
        )


def _shared_condition(
    type: str, status: str, last_transition_time: str | None, reason: str, message: str
) -> Condition:
    return Condition(
        shared(type),
        shared(status),
        None if last_transition_time is None else shared(last_transition_time),
        shared(reason),
        message,
    )


@dataclass(frozen=True, slots=True)
class APIService:
    name: str
    group: str
    version: str
    service: ServiceReference | None
    group_priority_minimum: int
    version_priority: int
    ca_bundle: bytes = b""
    insecure_skip_tls_verify: bool = False
    conditions: tuple[Condition, ...] = ()
    namespace: str = ""
    resource_version: str = ""
    # metadata.annotations, sorted (the per-APIService bounds read them: `backends/bounds.py`).
    annotations: tuple[tuple[str, str], ...] = ()
    # The decoded manifest (metadata and all), kept to serve the object back unchanged.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def local(self) -> bool:
        """No `spec.service`: served by kube-apiserver itself (built-in and CRD groups)."""
        return self.service is None

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def condition(self, kind: str = AVAILABLE) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def available(self) -> bool:
        """`IsAPIServiceConditionTrue(Available)`."""
        cond = self.condition()
        return cond is not None and cond.status == "True"

    def with_conditions(self, conditions: tuple[Condition, ...]) -> APIService:
        return replace(self, conditions=conditions)


def name_to_group_version(name: str) -> tuple[str, str]:
    """`APIServiceNameToGroupVersion`: `v1beta1.metrics.k8s.io` -> ("metrics.k8s.io", "v1beta1")."""
    version, _, group = name.partition(".")
    return group, version


def _decode_conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    out = []
    for i, item in enumerate(sequence(status, "conditions", "status.conditions")):
        path = f"status.conditions[{i}]"
        if not isinstance(item, dict):
            raise DecodeError(f"{path}: expected object")
        out.append(
            Condition(
                type=decode_field(item, "type", str, f"{path}.type", ""),
                status=decode_field(item, "status", str, f"{path}.status", ""),
                last_transition_time=decode_field(
                    item, "lastTransitionTime", str, f"{path}.lastTransitionTime"
                ),
                reason=decode_field(item, "reason", str, f"{path}.reason", ""),
                message=decode_field(item, "message", str, f"{path}.message", ""),
            )
        )
    return tuple(out)


def _decode_annotations(metadata: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    annotations = mapping(metadata, "annotations", "metadata.annotations")
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise DecodeError(f"metadata.annotations.{key}: expected string")
    return tuple(sorted(annotations.items()))


@functools.lru_cache(maxsize=256)
def _shared_bundle(encoded: str) -> tuple[str, bytes]:
    """One copy of each distinct caBundle, as text and decoded. The APIServices of one extension
    server trust one CA: each held its own copies (about 1.5 KB), and so did each worker process;
    objects sharing one are pickled once in a worker's first state, and stay shared there."""
    return encoded, base64.b64decode(encoded, validate=True)


def _shared_field(obj: Mapping[str, Any], key: str, path: str) -> str:
    """A text field many APIServices repeat (a version, a Service's namespace and name, the
    manifest's apiVersion and kind), held once in the process: the decoded manifest kept as
    `raw` is given the same copy."""
    value: str = decode_field(obj, key, str, path, "")
    if value and isinstance(obj, dict):
        value = obj[key] = shared(value)
    return value


def decode_apiservice(obj: Mapping[str, Any]) -> APIService:
    """Decode and default (`service.port` -> 443). Raises DecodeError on wrong types or bad base64."""
    metadata = mapping(obj, "metadata", "metadata")
    spec = mapping(obj, "spec", "spec")
    service = None
    if "service" in spec and spec["service"] is not None:
        ref = mapping(spec, "service", "spec.service")
        port = int32(ref, "port", "spec.service.port")
        service = ServiceReference(
            namespace=_shared_field(ref, "namespace", "spec.service.namespace"),
            name=_shared_field(ref, "name", "spec.service.name"),
            port=443 if port is None else port,
        )
    raw_bundle = decode_field(spec, "caBundle", str, "spec.caBundle", "")
    try:
        bundle_text, ca_bundle = _shared_bundle(raw_bundle) if raw_bundle else ("", b"")
    except (binascii.Error, ValueError) as err:
        raise DecodeError(f"spec.caBundle: illegal base64 data ({err})") from err
    if bundle_text and isinstance(spec, dict):
        spec["caBundle"] = bundle_text  # the same text, held once
    for key in ("apiVersion", "kind"):
        if isinstance(obj, dict) and isinstance(obj.get(key), str):
            obj[key] = shared(obj[key])
    return APIService(
        name=decode_field(metadata, "name", str, "metadata.name", ""),
        namespace=decode_field(metadata, "namespace", str, "metadata.namespace", ""),
        resource_version=decode_field(metadata, "resourceVersion", str, "metadata.resourceVersion", ""),
        group=decode_field(spec, "group", str, "spec.group", ""),
        version=_shared_field(spec, "version", "spec.version"),
        service=service,
        ca_bundle=ca_bundle,
        insecure_skip_tls_verify=decode_field(
            spec, "insecureSkipTLSVerify", bool, "spec.insecureSkipTLSVerify", False
        ),
        group_priority_minimum=int32(spec, "groupPriorityMinimum", "spec.groupPriorityMinimum", 0) or 0,
        version_priority=int32(spec, "versionPriority", "spec.versionPriority", 0) or 0,
        conditions=_decode_conditions(mapping(obj, "status", "status")),
        annotations=_decode_annotations(metadata),
        raw=obj,
    )


def validate_apiservice(svc: APIService) -> list[str]:
    """`ValidateAPIService`: every field error, in upstream's order and format."""
    errs: list[str] = []
    required_name = f"{svc.version}.{svc.group}"
    # ObjectMeta (cluster-scoped) with the APIService name function.
    if not svc.name:
        errs.append(fe.required("metadata.name", "name or generateName is required"))
    else:
        name_errors = fe.is_valid_path_segment_name(svc.name)
        if not name_errors and svc.name != required_name:
            name_errors = [f'must be `spec.version+"."+spec.group`: {fe.go_quote(required_name)}']
        errs.extend(fe.invalid("metadata.name", svc.name, msg) for msg in name_errors)
    if svc.namespace:
        errs.append(fe.forbidden("metadata.namespace", "not allowed on this type"))

    if not svc.group and svc.version != "v1":
        errs.append(fe.required("spec.group", "only v1 may have an empty group and it better be legacy kube"))
    if svc.group:
        errs.extend(fe.invalid("spec.group", svc.group, msg) for msg in fe.is_dns1123_subdomain(svc.group))
    errs.extend(fe.invalid("spec.version", svc.version, msg) for msg in fe.is_dns1035_label(svc.version))

    if svc.group_priority_minimum <= 0 or svc.group_priority_minimum > 20000:
        errs.append(
            fe.invalid(
                "spec.groupPriorityMinimum",
                svc.group_priority_minimum,
                "must be positive and less than 20000",
            )
        )
    if svc.version_priority <= 0 or svc.version_priority > 1000:
        errs.append(
            fe.invalid("spec.versionPriority", svc.version_priority, "must be positive and less than 1000")
        )

    if svc.service is None:
        if svc.ca_bundle:
            errs.append(
                fe.invalid(
                    "spec.caBundle",
                    f"{len(svc.ca_bundle)} bytes",
                    "local APIServices may not have a caBundle",
                )
            )
        if svc.insecure_skip_tls_verify:
            errs.append(
                fe.invalid(
                    "spec.insecureSkipTLSVerify", True, "local APIServices may not have insecureSkipTLSVerify"
                )
            )
        return errs

    if not svc.service.namespace:
        errs.append(fe.required("spec.service.namespace"))
    if not svc.service.name:
        errs.append(fe.required("spec.service.name"))
    for msg in fe.is_valid_port_num(svc.service.port):
        errs.append(fe.invalid("spec.service.port", svc.service.port, f"port is not valid: {msg}"))
    if svc.insecure_skip_tls_verify and svc.ca_bundle:
        errs.append(fe.invalid("spec.insecureSkipTLSVerify", True, "may not be true if caBundle is present"))
    return errs


def validate_status(svc: APIService) -> list[str]:
    """`ValidateAPIServiceStatus`: only condition statuses are checked."""
    return [
        fe.unsupported(f"status.conditions[{i}].status", c.status, list(CONDITION_STATUSES))
        for i, c in enumerate(svc.conditions)
        if c.status not in CONDITION_STATUSES
    ]


@functools.lru_cache(maxsize=2)
def _rfc3339(second: int) -> str:
    return dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    """metav1.Time's format, to the second (formatted once per second: every check stamps one)."""
    return _rfc3339(int(time.time()))


def set_condition(conditions: tuple[Condition, ...], new: Condition) -> tuple[Condition, ...]:
    """`SetAPIServiceCondition`: the transition time moves only when the status flips."""
    out = list(conditions)
    for i, existing in enumerate(out):
        if existing.type == new.type:
            transition = (
                new.last_transition_time if existing.status != new.status else existing.last_transition_time
            )
            out[i] = Condition(new.type, new.status, transition, new.reason, new.message)
            return tuple(out)
    out.append(new)
    return tuple(out)


def local_condition() -> Condition:
    return Condition(AVAILABLE, "True", now_rfc3339(), LOCAL_REASON, LOCAL_MESSAGE)


def available_column(svc: APIService) -> str:
    """The `Available` column of `kubectl get apiservices`."""
    cond = svc.condition()
    if cond is None:
        return "Unknown"
    if cond.status == "True":
        return "True"
    return f"{cond.status} ({cond.reason})" if cond.reason else cond.status


def service_column(svc: APIService) -> str:
    return "Local" if svc.service is None else f"{svc.service.namespace}/{svc.service.name}"
