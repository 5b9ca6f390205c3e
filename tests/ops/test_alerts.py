"""The alert rules: promtool accepts them and their unit tests pass, every alert has a test in
which it fires, the chart ships the same rules, and every metric, label and label value an
alert reads is exposed by a live server."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from promql_names import Catalogue, problems
from promtool_binary import promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
CHART = ROOT / "deploy" / "helm" / "ortserve"
CHART_RULES = CHART / "files" / "prometheus" / "alerts.yaml"


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    binary = promtool()
    for command in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        result = subprocess.run([binary, *command], capture_output=True, text=True, cwd=RULES.parent)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_in_which_it_fires_and_one_in_which_it_does_not() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    cases = [case for test in document["tests"] for case in test.get("alert_rule_test", [])]
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    names = {rule["alert"] for rule in alerts()}
    assert len(names) >= 9
    assert names - fires == set()
    assert names - quiet - {"OrtserveNoUsableLevel"} == set()  # its quiet case: the other models


def test_every_alert_reads_what_a_live_server_exposes(catalogue: Catalogue) -> None:
    found = {rule["alert"]: problems(rule["expr"], catalogue) for rule in alerts()}
    assert {name: issues for name, issues in found.items() if issues} == {}


def test_the_chart_ships_the_same_rules_as_a_prometheus_rule() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes()
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}}}
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="demo", namespace="serving")
    documents = [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]
    (rule,) = [doc for doc in documents if doc["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))


def test_the_chart_renders_no_prometheus_rule_by_default() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render({}, name="demo", namespace="serving")
    assert "PrometheusRule" not in "".join(rendered.values())
