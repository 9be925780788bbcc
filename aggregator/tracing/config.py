"""kube-apiserver's tracing configuration file: read, decoded strictly, validated, in its words.

The file is an `apiserver.config.k8s.io` `TracingConfiguration` (v1, v1beta1 or v1alpha1, as
kube-apiserver's scheme accepts), JSON or YAML:

    apiVersion: apiserver.config.k8s.io/v1
    kind: TracingConfiguration
    endpoint: otel-collector.monitoring:4317   # optional: OTLP/gRPC, default localhost:4317
    samplingRatePerMillion: 100                 # optional: without it only sampled parents are

Upstream: `ReadTracingConfiguration` (apiserver `pkg/server/options/tracing.go`: strict decoding,
so an unknown field is an error) and `ValidateTracingConfiguration` (component-base
`tracing/api/v1/config.go`), whose `field.Error` messages name the field and are reproduced byte
for byte. Decoding errors follow apimachinery's wording where Python can tell the same thing
(the unknown field, the Go type a value does not fit), not its YAML parser's line numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from aggregator.model.fielderrors import go_quote, invalid

GROUP = "apiserver.config.k8s.io"
# Every version kube-apiserver's config scheme registers TracingConfiguration in.
VERSIONS = ("v1", "v1beta1", "v1alpha1")
KIND = "TracingConfiguration"
MAX_SAMPLING_RATE_PER_MILLION = 1_000_000
_INT32 = (-(2**31), 2**31 - 1)
# The fields a TracingConfiguration has (TypeMeta inline, component-base's type inline).
_FIELDS = ("apiVersion", "kind", "endpoint", "samplingRatePerMillion")


class TracingConfigError(ValueError):
    """The file cannot be read, decoded or validated; `str()` is kube-apiserver's message."""


@dataclass(frozen=True, slots=True)
class TracingConfiguration:
    """component-base `TracingConfiguration`: None is "unset" (upstream's nil pointers)."""

    endpoint: str | None = None
    sampling_rate_per_million: int | None = None

    @property
    def sampling_ratio(self) -> float:
        """The root sampler's ratio (`NewProvider`: 0, NeverSample, unless a positive rate is set)."""
        rate = self.sampling_rate_per_million
        return rate / MAX_SAMPLING_RATE_PER_MILLION if rate is not None and rate > 0 else 0.0


def read_tracing_configuration(path: str) -> TracingConfiguration:
    """`ReadTracingConfiguration` then `ValidateTracingConfiguration`, with `ApplyTo`'s prefixes."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        reason = err.strerror or str(err)
        raise TracingConfigError(
            f"failed to read tracing config: unable to read tracing configuration from {go_quote(path)}: "
            f"open {path}: {reason.lower() if reason[:1].isupper() else reason}"
        ) from err
    try:
        config = decode(data)
    except TracingConfigError as err:
        raise TracingConfigError(
            f"failed to read tracing config: unable to decode tracing configuration data: {err}"
        ) from err
    errors = validate(config)
    if errors:
        # utilerrors.NewAggregate: one error alone, several as [a, b]
        listed = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise TracingConfigError(f"failed to validate tracing configuration: {listed}")
    return config


def decode(data: bytes) -> TracingConfiguration:
    """The universal decoder's strict decoding of JSON or YAML into the internal type."""
    try:
        document = yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise TracingConfigError(f"error converting YAML to JSON: {_one_line(err)}") from err
    if not isinstance(document, dict):
        raise TracingConfigError(
            "couldn't get version/kind; json parse error: json: cannot unmarshal "
            f"{_json_type(document)} into Go value of type struct {{ APIVersion string "
            '"json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'
        )
    text = json.dumps(document, separators=(",", ":"))
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if not kind:
        raise TracingConfigError(f"Object 'Kind' is missing in '{text}'")
    if not api_version:
        raise TracingConfigError(f"Object 'apiVersion' is missing in '{text}'")
    group, _, version = str(api_version).rpartition("/")
    if kind != KIND or group != GROUP or version not in VERSIONS:
        raise TracingConfigError(f"no kind {go_quote(str(kind))} is registered for version {go_quote(str(api_version))}")
    unknown = [name for name in document if name not in _FIELDS]
    if unknown:
        listed = ", ".join(f"unknown field {go_quote(name)}" for name in unknown)
        raise TracingConfigError(f"strict decoding error: {listed}")
    endpoint = document.get("endpoint")
    if endpoint is not None and not isinstance(endpoint, str):
        raise TracingConfigError(_unmarshal(endpoint, "endpoint", "string"))
    rate = document.get("samplingRatePerMillion")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int) or not _INT32[0] <= rate <= _INT32[1]
    ):
        raise TracingConfigError(_unmarshal(rate, "samplingRatePerMillion", "int32"))
    return TracingConfiguration(endpoint=endpoint, sampling_rate_per_million=rate)


def validate(config: TracingConfiguration) -> list[str]:
    """`ValidateTracingConfiguration` with a nil field path: each error names its field."""
    errors: list[str] = []
    rate = config.sampling_rate_per_million
    if rate is not None:
        if rate < 0:
            errors.append(invalid("samplingRatePerMillion", rate, "sampling rate must be positive"))
        if rate > MAX_SAMPLING_RATE_PER_MILLION:
            errors.append(
                invalid(
                    "samplingRatePerMillion",
                    rate,
                    "sampling rate per million must be less than or equal to one million",
                )
            )
    if config.endpoint is not None:
        errors.extend(validate_endpoint(config.endpoint))
    return errors


def validate_endpoint(endpoint: str) -> list[str]:
    """`validateEndpoint`: a gRPC target (`host:port`, `dns://`, `unix://`, `unix-abstract:`)."""
    if "//" not in endpoint:
        endpoint = "dns://" + endpoint
    try:
        scheme = urlsplit(endpoint).scheme
    except ValueError as err:
        return [invalid("endpoint", endpoint, str(err))]
    if scheme in ("dns", "unix", "unix-abstract"):
        return []
    return [
        invalid(
            "endpoint",
            endpoint,
            f"unsupported scheme: {scheme}.  Options are none, dns, unix, or unix-abstract.  "
            "See https://github.com/grpc/grpc/blob/master/doc/naming.md",
        )
    ]


def _unmarshal(value: Any, name: str, go_type: str) -> str:
    """encoding/json's UnmarshalTypeError for a field of the internal type."""
    what = f"number {value}" if isinstance(value, int | float) and not isinstance(value, bool) else _json_type(value)
    return f"json: cannot unmarshal {what} into Go struct field TracingConfiguration.{name} of type {go_type}"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
