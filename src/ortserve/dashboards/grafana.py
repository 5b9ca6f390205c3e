"""Grafana's dashboard JSON model (schemaVersion 39) of a Dashboard, and the files written from it.

Plain dicts, sorted keys and a fixed layout: the output is stable byte for byte, so a diff of
deploy/grafana/ shows what changed and ``--check`` can tell a stale file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ortserve.dashboards.boards import Dashboard, Panel, dashboards

__all__ = ["main", "render"]

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH = 24


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {"datasource": _DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
        for i, (expr, legend) in enumerate(panel.queries)
    ]
    if panel.kind == "heatmap":
        for target in targets:
            target["format"] = "heatmap"
    if panel.kind == "table":
        for target in targets:
            target.update({"format": "table", "instant": True})
    document: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "datasource": _DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": targets,
    }
    if panel.description:
        document["description"] = panel.description
    if panel.kind == "heatmap":
        document["options"] = {"calculate": False, "yAxis": {"unit": panel.unit}, "cellGap": 1}
    return document


def _variables(dashboard: Dashboard) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    ]
    if dashboard.model_variable:
        found.append(
            {
                "name": "model",
                "label": "Model",
                "type": "query",
                "datasource": _DATASOURCE,
                "query": {"query": "label_values(ortserve_requests_total, model)", "refId": "model"},
                "definition": "label_values(ortserve_requests_total, model)",
                "includeAll": True,
                "multi": True,
                "refresh": 2,
                "sort": 1,
            }
        )
    return found


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana's JSON model of ``dashboard``: panels laid out left to right, row by row."""
    panels, x, y, row_height = [], 0, 0, 0
    for panel_id, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > _WIDTH:
            x, y = 0, y + row_height
        panels.append(_panel_json(panel, panel_id, x, y))
        x, row_height = x + panel.width, 8
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": _variables(dashboard)},
        "annotations": {"list": []},
        "panels": panels,
    }


def _encoded(dashboard: Dashboard) -> bytes:
    return (json.dumps(render(dashboard), indent=2, sort_keys=True) + "\n").encode()


def _targets(root: Path) -> list[Path]:
    return [
        root / "deploy" / "grafana" / "dashboards",
        root / "deploy" / "helm" / "ortserve" / "files" / "grafana",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every dashboard file under the repository root."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    roots = [a for a in args if a != "--check"]
    root = Path(roots[0]) if roots else Path.cwd()
    stale: list[str] = []
    for folder in _targets(root):
        if not check:
            folder.mkdir(parents=True, exist_ok=True)
        for dashboard in dashboards():
            path, content = folder / f"{dashboard.uid}.json", _encoded(dashboard)
            if check:
                if not path.exists() or path.read_bytes() != content:
                    stale.append(str(path))
            else:
                path.write_bytes(content)
    for name in stale:
        print(f"{name} differs from ortserve.dashboards: run python -m ortserve.dashboards", file=sys.stderr)
    return 1 if stale else 0
