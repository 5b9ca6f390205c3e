"""The PNG of a bench or replay run: latency percentiles by level and latency over time.

matplotlib is optional (``ortserve[plot]``): :func:`plot_available` lets the command refuse
``--plot`` before a run rather than after it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.loadtest.report import PERCENTILES, LevelResult
from ortserve.loadtest.slo import Objective

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw", "plot", "plot_available"]

_LATENCY_METRICS = ("max", "mean")


def plot_available() -> bool:
    """Whether matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot(
    path: Path,
    results: list[LevelResult],
    x_label: str,
    title: str,
    objectives: Sequence[Objective] = (),
    concurrent: bool = False,
) -> None:
    """Write :func:`draw`'s figure as a PNG.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'ortserve[plot]'``).
    """
    import matplotlib.pyplot as plt

    figure = draw(results, x_label, title, objectives, concurrent)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def draw(
    results: list[LevelResult],
    x_label: str,
    title: str,
    objectives: Sequence[Objective] = (),
    concurrent: bool = False,
) -> Figure:
    """Percentiles by level (left) and p99/p50 per second (right), latency objectives as lines.

    Args:
        concurrent: the levels ran at the same time (a replay's target and comparison), so
            they share the time axis; otherwise they ran one after another.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_level, over_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    _by_level(by_level, results, x_label)
    _over_time(over_time, results, concurrent)
    for axes in (by_level, over_time):
        _objective_lines(axes, objectives)
        axes.legend(fontsize="small")
        axes.grid(True, which="both", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.canvas.draw()  # tick labels exist from here on: make them plain numbers
    for axes in (by_level, over_time):
        _plain_ticks(axes)
    return figure


def _by_level(axes: Axes, results: list[LevelResult], x_label: str) -> None:
    xs = [r.x for r in results]
    for p in PERCENTILES:
        axes.plot(
            xs, [r.measurement.latency.percentile(p) / 1000 for r in results], marker="o", label=f"p{p:g}"
        )
    axes.set(xlabel=x_label, ylabel="latency (ms)", title="Latency percentiles", yscale="log")
    if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8:
        axes.set_xscale("log", base=2)


def _over_time(axes: Axes, results: list[LevelResult], concurrent: bool) -> None:
    offset = 0
    for result in results:
        seconds = sorted(result.measurement.windows)
        windows = [result.measurement.windows[s] for s in seconds]
        ts = [offset + s for s in seconds]
        (line,) = axes.plot(
            ts, [w.latency.percentile(99) / 1000 for w in windows], marker=".", label=f"{result.label} p99"
        )
        axes.plot(
            ts, [w.latency.percentile(50) / 1000 for w in windows], linestyle=":", color=line.get_color()
        )
        if not concurrent:
            offset += (seconds[-1] + 1) if seconds else 0
    axes.set(
        xlabel="time (s)" if concurrent else "time (s; levels one after another)",
        ylabel="latency (ms)",
        title="p99 (solid) and p50 (dotted) per second",
        yscale="log",
    )


def _objective_lines(axes: Axes, objectives: Sequence[Objective]) -> None:
    for objective in objectives:
        if objective.metric in _LATENCY_METRICS or objective.metric.startswith("p"):
            axes.axhline(
                objective.limit / 1000,
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"SLO {objective.text}",
            )


def _plain_ticks(axes: Axes) -> None:
    """Tick labels as plain numbers (4, 0.5, 128) where log axes would write 4×10⁰."""
    import matplotlib.ticker

    for axis in (axes.xaxis, axes.yaxis):
        for minor in (False, True):
            default = axis.get_minor_formatter() if minor else axis.get_major_formatter()
            formatter = matplotlib.ticker.FuncFormatter(_plain(default))
            if minor:
                axis.set_minor_formatter(formatter)
            else:
                axis.set_major_formatter(formatter)


def _plain(default: Any) -> Any:
    def label(value: float, position: int | None) -> str:
        return f"{value:g}" if default(value, position) else ""  # keep the default's choice of ticks

    return label
