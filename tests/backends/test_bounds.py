"""Per-APIService bounds from annotations: what each one sets, and what a bad one costs (nothing)."""

from __future__ import annotations

from aggregator.backends.bounds import DEFAULT_BOUNDS, read_bounds


def test_no_annotation_of_ours_keeps_every_default() -> None:
    assert read_bounds([("kubectl.kubernetes.io/last-applied-configuration", "{}")]) is DEFAULT_BOUNDS
    assert DEFAULT_BOUNDS.connect_timeout == 5.0
    assert DEFAULT_BOUNDS.response_header_timeout is None and DEFAULT_BOUNDS.request_timeout is None
    assert DEFAULT_BOUNDS.max_concurrent_requests == 0 and DEFAULT_BOUNDS.long_running is None


def test_every_annotation_sets_its_bound() -> None:
    bounds = read_bounds(
        [
            ("aggregator.dev/connect-timeout", "1500ms"),
            ("aggregator.dev/response-header-timeout", "2s"),
            ("aggregator.dev/request-timeout", "1m30s"),
            ("aggregator.dev/long-running-paths", "/apis/g/v/namespaces/*/things/*/stream, /apis/g/v/tail"),
            ("aggregator.dev/max-concurrent-requests", "20"),
            ("aggregator.dev/outlier-consecutive-errors", "3"),
            ("aggregator.dev/outlier-ejection-time", "2s"),
            ("aggregator.dev/outlier-max-ejection-time", "1m"),
        ]
    )
    assert (bounds.connect_timeout, bounds.response_header_timeout, bounds.request_timeout) == (
        1.5,
        2.0,
        90.0,
    )
    assert (bounds.max_concurrent_requests, bounds.consecutive_errors) == (20, 3)
    assert (bounds.ejection_time, bounds.max_ejection_time) == (2.0, 60.0)
    assert bounds.problems == ()
    assert bounds.long_running is not None
    assert bounds.long_running("/apis/g/v/namespaces/a/things/b/stream")
    assert bounds.long_running("/apis/g/v/tail")
    assert not bounds.long_running("/apis/g/v/namespaces/a/things/b")


def test_a_bad_value_is_named_and_its_default_used() -> None:
    bounds = read_bounds(
        [
            ("aggregator.dev/connect-timeout", "5"),  # Go durations need a unit
            ("aggregator.dev/response-header-timeout", "-1s"),
            ("aggregator.dev/max-concurrent-requests", "many"),
            ("aggregator.dev/long-running-paths", "stream"),
            ("aggregator.dev/outlier-ejection-time", "10s"),
            ("aggregator.dev/outlier-max-ejection-time", "1s"),
            ("aggregator.dev/retries", "3"),
        ]
    )
    assert bounds.connect_timeout == 5.0 and bounds.response_header_timeout is None
    assert bounds.max_concurrent_requests == 0 and bounds.long_running is None
    assert (bounds.ejection_time, bounds.max_ejection_time) == (10.0, 10.0)
    assert bounds.problems == (
        'annotation aggregator.dev/connect-timeout="5" ignored: not a duration '
        '(time: missing unit in duration "5"); using the default (5s)',
        'annotation aggregator.dev/response-header-timeout="-1s" ignored: must be above zero; using the default (none)',
        'annotation aggregator.dev/max-concurrent-requests="many" ignored: not an integer; using the default (no limit)',
        "annotation aggregator.dev/long-running-paths=\"stream\" ignored: pattern 'stream' does not start with /; "
        "using the default (none)",
        "annotation aggregator.dev/retries is not one the gateway knows; ignored",
        "annotation aggregator.dev/outlier-max-ejection-time is below the ejection time; using 10s",
    )


def test_the_example_sets_every_annotation_without_a_problem() -> None:
    """examples/resilience: every annotation the reference documents, each one valid."""
    from pathlib import Path

    import yaml

    from aggregator.backends import bounds as module
    from aggregator.model.apiservice import decode_apiservice

    example = Path(__file__).parents[2] / "examples/resilience/apiservice.yaml"
    svc = decode_apiservice(
        next(d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "APIService")
    )
    bounds = read_bounds(svc.annotations)
    assert bounds.problems == ()
    documented = {
        v
        for k, v in vars(module).items()
        if isinstance(v, str) and v.startswith(module.PREFIX) and k.isupper()
    }
    # The quarantine is for groups that store nothing: its own example (examples/quarantine).
    assert {k for k, _ in svc.annotations} == documented - {module.PREFIX, module.DISCOVERY_QUARANTINE_AFTER}
    reference = (Path(__file__).parents[2] / "docs/reference.md").read_text()
    assert all(f"| `{annotation}` |" in reference for annotation in documented - {module.PREFIX})


def test_the_discovery_quarantine_annotation_is_read_with_the_others() -> None:
    assert DEFAULT_BOUNDS.discovery_quarantine_after is None
    assert read_bounds([("aggregator.dev/discovery-quarantine-after", "2m")]).discovery_quarantine_after == 120.0
    bad = read_bounds([("aggregator.dev/discovery-quarantine-after", "soon")])
    assert bad.discovery_quarantine_after is None
    assert bad.problems == (
        'annotation aggregator.dev/discovery-quarantine-after="soon" ignored: not a duration '
        '(time: invalid duration "soon"); using the default (no quarantine)',
    )


def test_the_quarantine_example_is_a_metrics_apiservice_without_a_problem() -> None:
    from pathlib import Path

    import yaml

    from aggregator.model.apiservice import decode_apiservice

    example = Path(__file__).parents[2] / "examples/quarantine/apiservice.yaml"
    svc = decode_apiservice(yaml.safe_load(example.read_text()))
    assert svc.group == "metrics.k8s.io"
    bounds = read_bounds(svc.annotations)
    assert bounds.problems == () and bounds.discovery_quarantine_after == 120.0
