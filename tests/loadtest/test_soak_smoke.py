"""A 25-second run of benchmarks/soak.py: every transport and both pipeline routes, faults
switching levels (0 -> 2, 0+2 -> remembered answers), disconnects, slow readers, malformed
requests and reloads, with every answer checked against its own input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SOAK = Path(__file__).parent.parent.parent / "benchmarks" / "soak.py"


def test_a_short_soak_loses_no_answer_and_visits_every_level(tmp_path: Path) -> None:
    command = [sys.executable, str(SOAK), "--duration-s", "25", "--window-s", "5", "--cycle-scale", "0.25"]
    command += ["--reload-s", "15", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "soak.json").read_text())
    totals = result["totals"]
    assert "lost" not in totals and "wrong" not in totals, result["examples"]
    assert totals["ok"] > 0 and totals["degraded"] > 0 and totals["expected_4xx"] > 0
    levels = {level for window in result["windows"] for level in window["levels"]}
    assert {"0", "2", "3"} <= levels
    assert result["by_client"]["predict"]["ok"] > 0 and result["by_client"]["route"]["ok"] > 0
    assert result["reloads"] >= 2 and result["level_moves_logged"] >= 3  # the model, then hotword
    assert result["problems"] == []
