"""The Grafana dashboards: the committed JSON is what the generator builds, every panel query is
valid PromQL (promtool) and reads metrics, labels and values a live server exposes, panels do not
overlap, and the chart ships the same boards as a ConfigMap."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from ortserve.dashboards import dashboards, expressions, main, render
from promql_names import Catalogue, problems
from promtool_binary import promtool

ROOT = Path(__file__).resolve().parents[2]
BOARDS = ROOT / "deploy" / "grafana" / "dashboards"
CHART = ROOT / "deploy" / "helm" / "ortserve"
_VARIABLES = {"$__rate_interval": "5m", "$model": ".*"}


def test_the_committed_files_are_what_the_generator_builds() -> None:
    assert main(["--check", str(ROOT)]) == 0
    assert sorted(p.name for p in BOARDS.glob("*.json")) == sorted(f"{d.uid}.json" for d in dashboards())


def test_every_panel_query_reads_what_a_live_server_exposes(catalogue: Catalogue) -> None:
    found = {
        (board.uid, title, expr): issues
        for board in dashboards()
        for title, expr in expressions(board)
        if (issues := problems(expr, catalogue))
    }
    assert found == {}


def test_promtool_accepts_every_panel_query(tmp_path: Path) -> None:
    rules = []
    for board in dashboards():
        for index, (_, expr) in enumerate(expressions(board)):
            for variable, value in _VARIABLES.items():
                expr = expr.replace(variable, value)
            rules.append({"record": f"panel:{board.uid.replace('-', '_')}:{index}", "expr": expr})
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("board", dashboards(), ids=lambda b: b.uid)
def test_panels_have_queries_unique_ids_and_do_not_overlap(board: object) -> None:
    document = render(board)  # type: ignore[arg-type]
    cells: set[tuple[int, int]] = set()
    for panel in document["panels"]:
        assert panel["targets"], panel["title"]
        place = panel["gridPos"]
        area = {
            (x, y)
            for x in range(place["x"], place["x"] + place["w"])
            for y in range(place["y"], place["y"] + place["h"])
        }
        assert place["x"] + place["w"] <= 24
        assert not cells & area, panel["title"]
        cells |= area
    assert len({p["id"] for p in document["panels"]}) == len(document["panels"])


def test_the_boards_hold_what_operators_look_for() -> None:
    kinds = {board.uid: {panel.kind for panel in board.panels} for board in dashboards()}
    assert "heatmap" in kinds["ortserve-model"]
    titles = {board.uid: " ".join(p.title for p in board.panels).lower() for board in dashboards()}
    for uid, words in {
        "ortserve-overview": ["requests/s", "error", "queue", "event-loop", "tenant", "gc pauses"],
        "ortserve-model": ["p99", "queue wait vs compute", "batch", "refusals by reason"],
        "ortserve-llm": ["tokens/s", "first token", "inter-token", "kv"],
        "ortserve-lifecycle": ["loads", "fallback", "breakers", "routed", "rollout"],
    }.items():
        assert [w for w in words if w not in titles[uid]] == []


def test_the_chart_ships_the_same_boards_as_a_configmap() -> None:
    values = {"grafanaDashboards": {"enabled": True, "annotations": {"grafana_folder": "ortserve"}}}
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="demo", namespace="serving")
    documents = [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]
    (config_map,) = [doc for doc in documents if doc["kind"] == "ConfigMap"]
    kubernetes_validate.validate(config_map, "1.33.0", strict=True)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = {name: json.loads(text) for name, text in config_map["data"].items()}
    assert shipped == {p.name: json.loads(p.read_text(encoding="utf-8")) for p in BOARDS.glob("*.json")}
