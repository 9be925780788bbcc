"""The monitoring overlay's alerts, proven with Prometheus's own `promtool`.

`promtool check rules` parses every expression and template as the Prometheus the Operator runs
would; `promtool test rules` runs alerts_test.yaml, in which every alert has a case where it fires
(with its labels and rendered annotations) and one where it stays quiet.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.manifests.k8s import MANIFESTS, find
from tests.support.prometheus import PROMTOOL, needs_promtool, rule_groups

pytestmark = needs_promtool

RULE_FILE = MANIFESTS / "overlays/components/monitoring/prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")


def alert_names() -> list[str]:
    rule = find([yaml.safe_load(RULE_FILE.read_text())], "PrometheusRule", "aggregator", "aggregator-system")
    return [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def write_rules(directory: Path) -> Path:
    rule = yaml.safe_load(RULE_FILE.read_text())
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(rule), sort_keys=False))
    return path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    done = promtool("check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_the_check_refuses_a_broken_expression(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    rules.write_text(rules.read_text().replace("== 1", "== == 1", 1))
    done = promtool("check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode != 0 and "parse error" in done.stdout + done.stderr


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say(tmp_path: Path) -> None:
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fires == quiet == set(alert_names())


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("severity: warning\n              name: v1beta1.dead.example.com", "severity: critical\n              name: v1beta1.dead.example.com"),
        ("- eval_time: 4m\n        alertname: AggregatorAPIServiceUnavailable\n        exp_alerts: []",
         "- eval_time: 4m\n        alertname: AggregatorAPIServiceUnavailable\n        exp_alerts:\n          - exp_labels: {severity: warning, name: v1beta1.dead.example.com}"),
    ],
    ids=["a wrong label", "firing too early"],
)  # fmt: skip
def test_the_unit_tests_can_fail(tmp_path: Path, old: str, new: str) -> None:
    write_rules(tmp_path)
    text = UNIT_TESTS.read_text()
    assert old in text
    (tmp_path / UNIT_TESTS.name).write_text(text.replace(old, new, 1))
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode != 0, done.stdout
