"""The alert rules operators load (deploy/prometheus/alerts.yml): promtool's own unit tests pass,
and every rule carries a severity, a `for:`, a summary and a runbook link that exists."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from tests.deploy.prometheus_package import debian_binary
from tests.helpers import REPO

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
TESTS = REPO / "deploy" / "prometheus" / "alerts.test.yml"


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_every_rule_has_a_severity_a_for_a_summary_and_a_runbook_that_exists() -> None:
    anchors = {_anchor(line.lstrip("#").strip()) for line in (REPO / "docs" / "troubleshooting.md").read_text().splitlines()
               if line.startswith("#")}
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert "for" in rule and rule["annotations"]["summary"], rule["alert"]
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/troubleshooting.md" and anchor in anchors, rule["alert"]


def test_every_rule_has_a_promtool_case_that_fires_it() -> None:
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fired = {c["alertname"] for test in cases for c in test["alert_rule_test"] if c["exp_alerts"]}
    assert fired == {rule["alert"] for rule in rules()}


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = debian_binary("promtool")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(TESTS)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, check=False, cwd=TESTS.parent)
        assert done.returncode == 0, done.stdout + done.stderr
