"""``python -m ortserve.dashboards [ROOT] [--check]``."""

from __future__ import annotations

from ortserve.dashboards.grafana import main

raise SystemExit(main())
