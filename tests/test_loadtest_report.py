"""Bench/replay reports: the table, the stamped JSON document, and the PNG plot."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.report import LevelResult, plot, render_table, result_document
from ortserve.loadtest.slo import judge, parse_objective


def _results() -> list[LevelResult]:
    results = []
    for concurrency in (1, 8):
        measurement = Measurement(elapsed_s=2.0)
        for index in range(200):
            measurement.record(index // 100, 200, 500 * concurrency + index)
        measurement.record(1, 429, 0)
        results.append(LevelResult(f"concurrency {concurrency}", concurrency, measurement))
    return results


def test_the_table_has_a_row_per_level_with_errors_by_status() -> None:
    table = render_table(_results())
    rows = table.splitlines()[2:]
    assert len(rows) == 2
    assert rows[1].startswith("concurrency 8") and "429: 1" in rows[1]


def test_the_json_result_is_stamped_and_carries_the_verdicts() -> None:
    results = _results()
    verdicts = judge([parse_objective("p99=2ms")], [(r.label, r.measurement) for r in results])
    document = orjson.loads(result_document("bench", {"model": "m"}, results, verdicts))
    assert {"ortserve", "python", "cpu", "git_revision", "time_utc"} <= document["environment"].keys()
    assert document["settings"] == {"model": "m"}
    assert [v["ok"] for v in document["slo"]] == [True, False] and document["slo_ok"] is False
    summary = document["levels"][1]["summary"]
    assert summary["requests"] == 201 and summary["statuses"] == {"200": 200, "429": 1}
    assert summary["latency_ms"]["p50"] == pytest.approx(4.1, rel=0.01)


def test_the_plot_is_written_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.png"
    plot(out, _results(), "concurrency", "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
