"""The tracing configuration file: what kube-apiserver accepts, and its refusals in its words.

Validation messages are component-base's `ValidateTracingConfiguration` field errors byte for byte
(with kube-apiserver's `ApplyTo` prefix); `aggregator serve` refuses a bad file at start-up with
that message, naming the flag and the field.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.tracing.config import TracingConfigError, TracingConfiguration, read_tracing_configuration
from aggregator.tracing.options import TracingOptions, tracer_for

V1 = "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tracing.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha1"])
def test_every_version_kube_apiserver_accepts_reads(tmp_path: Path, version: str) -> None:
    path = write(
        tmp_path,
        f"apiVersion: apiserver.config.k8s.io/{version}\nkind: TracingConfiguration\n"
        "endpoint: otel-collector.monitoring:4317\nsamplingRatePerMillion: 250\n",
    )
    config = read_tracing_configuration(path)
    assert config == TracingConfiguration("otel-collector.monitoring:4317", 250)
    assert config.sampling_ratio == 0.00025


def test_json_and_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, '{"apiVersion": "apiserver.config.k8s.io/v1", "kind": "TracingConfiguration"}')
    config = read_tracing_configuration(path)
    assert config == TracingConfiguration(None, None) and config.sampling_ratio == 0.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "samplingRatePerMillion: -1\n",
            "failed to validate tracing configuration: samplingRatePerMillion: Invalid value: -1: "
            "sampling rate must be positive",
        ),
        (
            "samplingRatePerMillion: 1000001\n",
            "failed to validate tracing configuration: samplingRatePerMillion: Invalid value: 1000001: "
            "sampling rate per million must be less than or equal to one million",
        ),
        (
            "endpoint: http://collector:4317\n",
            'failed to validate tracing configuration: endpoint: Invalid value: "http://collector:4317": '
            "unsupported scheme: http.  Options are none, dns, unix, or unix-abstract.  "
            "See https://github.com/grpc/grpc/blob/master/doc/naming.md",
        ),
        (
            "endpoint: https://collector:4317\nsamplingRatePerMillion: -5\n",
            "failed to validate tracing configuration: [samplingRatePerMillion: Invalid value: -5: sampling "
            'rate must be positive, endpoint: Invalid value: "https://collector:4317": unsupported scheme: '
            "https.  Options are none, dns, unix, or unix-abstract.  "
            "See https://github.com/grpc/grpc/blob/master/doc/naming.md]",
        ),
        (
            "endpoit: collector:4317\n",
            'failed to read tracing config: unable to decode tracing configuration data: strict decoding '
            'error: unknown field "endpoit"',
        ),
        (
            "samplingRatePerMillion: lots\n",
            "failed to read tracing config: unable to decode tracing configuration data: json: cannot "
            "unmarshal string into Go struct field TracingConfiguration.samplingRatePerMillion of type int32",
        ),
        (
            "samplingRatePerMillion: 3000000000\n",
            "failed to read tracing config: unable to decode tracing configuration data: json: cannot "
            "unmarshal number 3000000000 into Go struct field TracingConfiguration.samplingRatePerMillion "
            "of type int32",
        ),
    ],
    ids=["negative-rate", "rate-above-a-million", "http-endpoint", "both", "unknown-field", "not-a-number", "not-int32"],
)
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TracingConfigError) as refused:
        read_tracing_configuration(write(tmp_path, V1 + body))
    assert str(refused.value) == message


@pytest.mark.parametrize("endpoint", ["collector:4317", "dns:///collector:4317", "unix:///run/otel.sock"])
def test_grpc_targets_are_accepted_as_endpoints(tmp_path: Path, endpoint: str) -> None:
    assert read_tracing_configuration(write(tmp_path, V1 + f"endpoint: {endpoint}\n")).endpoint == endpoint


def test_another_kind_or_group_is_not_a_tracing_configuration(tmp_path: Path) -> None:
    for text, message in (
        ("apiVersion: apiserver.config.k8s.io/v1\nkind: EgressSelectorConfiguration\n",
         'no kind "EgressSelectorConfiguration" is registered for version "apiserver.config.k8s.io/v1"'),
        ("apiVersion: apiserver.k8s.io/v1\nkind: TracingConfiguration\n",
         'no kind "TracingConfiguration" is registered for version "apiserver.k8s.io/v1"'),
        ("apiVersion: apiserver.config.k8s.io/v1\n", "Object 'Kind' is missing in"),
    ):  # fmt: skip
        with pytest.raises(TracingConfigError) as refused:
            read_tracing_configuration(write(tmp_path, text))
        assert message in str(refused.value)


def test_the_options_report_a_missing_file_as_kube_apiserver_does(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    errors = TracingOptions(config_file=missing).validate()
    assert [str(e) for e in errors] == [f"--tracing-config-file: tracing-config-file {missing} does not exist"]
    assert TracingOptions().validate() == [] and tracer_for(TracingOptions().configuration()) is None


def serve(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """`aggregator serve` as a user runs it (`prelude` runs first in the same interpreter)."""
    code = f"import sys\n{prelude}\nfrom aggregator.commands.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "serve", "--apiservices-dir", ".", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_refuses_a_bad_file_at_start_up_naming_the_flag_and_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, V1 + "samplingRatePerMillion: -1\n")
    run = serve("--tracing-config-file", path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "aggregator serve: --tracing-config-file: failed to validate tracing configuration: "
        "samplingRatePerMillion: Invalid value: -1: sampling rate must be positive"
    )


def test_serve_without_the_tracing_extra_says_which_to_install(tmp_path: Path) -> None:
    path = write(tmp_path, V1)
    # As if `aggregator[tracing]` were not installed: its OTLP exporter cannot be imported.
    run = serve("--tracing-config-file", path, prelude="sys.modules['opentelemetry.exporter'] = None")
    assert run.returncode == 2, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("aggregator serve: --tracing-config-file: tracing needs the OpenTelemetry SDK")
    assert last.endswith("pip install 'aggregator[tracing]'"), last
