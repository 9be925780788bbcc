"""`--tracing-config-file`, as kube-apiserver's `TracingOptions` (apiserver `pkg/server/options/tracing.go`).

Off without the flag: nothing of OpenTelemetry is imported, the request path has no span and no
hook does anything. With it, the file must exist (`Validate`), decode and validate (`ApplyTo`),
and the optional dependencies must be installed (`pip install 'aggregator[tracing]'`): each
problem is a start-up error naming the flag.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aggregator.tracing.config import TracingConfigError, TracingConfiguration, read_tracing_configuration
from aggregator.util.flags import ConfigError, FlagSet

if TYPE_CHECKING:
    from aggregator.tracing.api import RequestTracer

FLAG = "--tracing-config-file"
EXTRA = "aggregator[tracing]"
# What `aggregator[tracing]` installs, by the modules the gateway imports from it.
REQUIRED_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


def missing_modules() -> list[str]:
    """The OpenTelemetry modules that cannot be imported here."""
    missing = []
    for name in REQUIRED_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


@dataclass
class TracingOptions:
    config_file: str | None = None

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "tracing", prefix)
        flags.add(
            FLAG,
            field="config_file",
            help="File with apiserver tracing configuration (apiserver.config.k8s.io TracingConfiguration: "
            "endpoint, samplingRatePerMillion): every request's spans go to an OTLP/gRPC collector. Needs "
            f"'{EXTRA}'. Off without it.",
        )

    def validate(self) -> list[ConfigError]:
        """Every problem with the flag: a missing file, one that does not decode or validate
        (kube-apiserver's messages, naming the field), the optional dependencies not installed."""
        path = self.config_file
        if not path:
            return []
        errors: list[ConfigError] = []
        if not os.path.exists(path):
            errors.append(ConfigError(FLAG, f"tracing-config-file {path} does not exist"))
        else:
            try:
                read_tracing_configuration(path)
            except TracingConfigError as err:
                errors.append(ConfigError(FLAG, str(err)))
        missing = missing_modules()
        if missing:
            errors.append(
                ConfigError(
                    FLAG,
                    "tracing needs the OpenTelemetry SDK and its OTLP/gRPC exporter, which are not installed "
                    f"(no {', '.join(missing)}): pip install '{EXTRA}'",
                )
            )
        return errors

    def configuration(self) -> TracingConfiguration | None:
        """The validated configuration, None when tracing is off."""
        if not self.config_file:
            return None
        try:
            return read_tracing_configuration(self.config_file)
        except TracingConfigError as err:
            raise ConfigError(FLAG, str(err)) from err

    def apply_to(self, config: TracingTarget) -> None:
        config.tracing = self.configuration()


class TracingTarget(Protocol):
    tracing: TracingConfiguration | None


def tracer_for(
    config: TracingConfiguration | None, *, audit_id: Callable[[Any], str | None] | None = None
) -> RequestTracer | None:
    """The process's tracer, None when tracing is off (OpenTelemetry is imported only then).
    `audit_id` reads a request's audit ID, named on its span."""
    if config is None:
        return None
    if missing_modules():
        raise ConfigError(FLAG, f"tracing needs '{EXTRA}': pip install '{EXTRA}'")
    from aggregator.tracing.otel import OtelTracing

    return OtelTracing(config) if audit_id is None else OtelTracing(config, audit_id=audit_id)
