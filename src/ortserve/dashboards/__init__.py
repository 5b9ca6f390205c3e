"""The Grafana dashboards of deploy/grafana/, built from code so every query lives in one place.

``python -m ortserve.dashboards`` writes deploy/grafana/dashboards/*.json and the Helm chart's
copies; ``--check`` fails when a committed file differs from what this package builds (the
tests run it, and read every query back against a live server's /metrics). No dashboard
library: four boards of plain dicts need none.
"""

from __future__ import annotations

from ortserve.dashboards.boards import Dashboard, Panel, dashboards, expressions
from ortserve.dashboards.grafana import main, render

__all__ = ["Dashboard", "Panel", "dashboards", "expressions", "main", "render"]
