"""Bench/replay reports: the table, the stamped JSON document, and the PNG plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.plot import draw, plot
from ortserve.loadtest.report import LevelResult, render_table, result_document
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


def test_plot_ticks_are_plain_numbers_and_latency_objectives_are_drawn() -> None:
    pytest.importorskip("matplotlib")
    results = _results()
    results.append(LevelResult("concurrency 16", 16, results[1].measurement))  # x spans 1..16: log2 axis
    figure = draw(results, "concurrency", "t", [parse_objective("p99=3ms"), parse_objective("rate=5/s")])
    labels = [
        label.get_text()
        for axes in figure.axes
        for axis in (axes.xaxis, axes.yaxis)
        for label in axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True)
    ]
    assert "16" in labels and "4" in labels
    assert not [text for text in labels if "10^" in text or "×" in text or "\\times" in text]
    for axes in figure.axes:
        (slo,) = [line for line in axes.get_lines() if line.get_label() == "SLO p99=3ms"]
        assert np.asarray(slo.get_ydata()).tolist() == [3.0, 3.0]  # the rate objective has no latency line


def test_a_replay_plot_puts_target_and_comparison_on_one_time_axis() -> None:
    pytest.importorskip("matplotlib")
    results = _results()
    sequential, concurrent = (draw(results, "speed", "t", concurrent=c).axes[1] for c in (False, True))
    starts = [np.asarray(line.get_xdata())[0] for line in concurrent.get_lines()[::2]]
    assert starts == [0, 0]
    assert [np.asarray(line.get_xdata())[0] for line in sequential.get_lines()[::2]] == [0, 2]


def test_replay_plot_titles_name_the_capture_files_not_a_python_list() -> None:
    from ortserve.cli.loadtest import _plot_title

    settings: dict[str, object] = {"capture": ["/var/cap/a.ocap", "/var/cap/b"], "model": None}
    assert _plot_title("replay", settings) == "ortserve replay: a.ocap, b"
    assert _plot_title("bench", {"model": "small_mlp"}) == "ortserve bench: small_mlp"


def test_plot_without_matplotlib_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from click.testing import CliRunner

    from ortserve.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec: not importable
    args = ["bench", "http://127.0.0.1:9/", "-m", "m", "--plot", str(tmp_path / "p.png")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--plot" in result.stderr and "needs matplotlib" in result.stderr


def test_refusals_have_their_own_latency_and_it_survives_the_round_trip() -> None:
    measurement = Measurement(elapsed_s=1.0)
    measurement.record(0, 200, 9000)
    measurement.record(0, 429, 300)
    measurement.record(0, 1, 30_000_000)  # a client timeout is no answer: not a refusal
    assert measurement.refused.total == 1 and measurement.refused.max_value == 300
    again = Measurement.from_dict(orjson.loads(orjson.dumps(measurement.to_dict())))
    assert again.refused.total == 1
    document = orjson.loads(result_document("bench", {}, [LevelResult("r", 1.0, measurement)], []))
    assert document["levels"][0]["summary"]["refused_latency_ms"]["p50"] == pytest.approx(0.3, rel=0.05)
