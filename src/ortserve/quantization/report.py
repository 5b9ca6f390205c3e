"""What a candidate costs and how far it is from the source: file size, in-process latency at
batch 1 and 32, and output divergence on the calibration feeds, as rows of a table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortserve.quantization.calibration import Feeds
from ortserve.routing.compare import OutputDivergence, compare_arrays

__all__ = [
    "Measurement",
    "Outputs",
    "compare_models",
    "format_table",
    "latency_ms",
    "run_all",
    "session",
    "size_bytes",
]

Outputs = list[dict[str, np.ndarray]]
_ROUNDS_S = 0.3


@dataclass(frozen=True, slots=True)
class Measurement:
    """One row: a variant, its size, latency and divergence from the source (None: the source)."""

    variant: str
    version: str
    size_bytes: int
    b1_ms: float | None
    b32_ms: float | None
    max_abs: float | None = None
    p99_max_abs: float | None = None
    top1: float | None = None
    topk: float | None = None
    pairs: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def size_bytes(folder: Path, filename: str) -> int:
    """The model file and any external-data files beside it (other artefacts excluded)."""
    model = folder / filename
    extra = [p for p in folder.iterdir() if p.suffix in (".data", ".bin") and p.is_file()]
    return model.stat().st_size + sum(p.stat().st_size for p in extra)


def latency_ms(sess: ort.InferenceSession, feed: Feeds, rows: int) -> float | None:
    """Median milliseconds of one run at ``rows`` rows (None when the batch dim is fixed)."""
    first = sess.get_inputs()[0].shape[0]
    if isinstance(first, int) and first > 0 and first != rows:
        return None
    batch = {name: np.resize(array, (rows, *array.shape[1:])) for name, array in feed.items()}
    for _ in range(3):
        sess.run(None, batch)
    times: list[float] = []
    deadline = time.perf_counter() + _ROUNDS_S
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 500):
        started = time.perf_counter()
        sess.run(None, batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def run_all(sess: ort.InferenceSession, feeds: Sequence[Feeds]) -> Outputs:
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(None, dict(feed)), strict=True)) for feed in feeds]


def compare_models(reference: Outputs, candidate: Outputs) -> tuple[float, float, float | None, float | None]:
    """(max abs, p99 of per-request max abs, top-1 agreement, top-k agreement) over the feeds.

    A score output of one column (``[rows, 1]``, as a ranking model's) is compared as a ranking
    of the request's rows: top-1 is whether the best row is the same.
    """
    worst: list[float] = []
    top1: list[float] = []
    topk: list[float] = []
    for ours, theirs in zip(reference, candidate, strict=True):
        found: list[OutputDivergence] = []
        for name, array in ours.items():
            other = theirs[name]
            if array.ndim == 2 and array.shape[1] == 1 and array.shape[0] > 1 and other.shape == array.shape:
                found.append(compare_arrays(name, array.T, other.T))
            else:
                found.append(compare_arrays(name, array, other))
        worst.append(max(f.max_abs for f in found))
        top1.extend(f.top1 for f in found if f.top1 is not None)
        topk.extend(f.topk for f in found if f.topk is not None)
    p99 = float(np.percentile(worst, 99, method="higher"))
    return (
        max(worst),
        p99,
        float(np.mean(top1)) if top1 else None,
        float(np.mean(topk)) if topk else None,
    )


def format_table(rows: Sequence[Measurement], source_label: str = "fp32") -> str:
    """A plain-text table, one row per variant."""
    header = (
        "variant",
        "version",
        "size MB",
        "b1 ms",
        "b32 ms",
        "max |diff|",
        "p99 max |diff|",
        "top-1",
        "top-k",
    )
    lines = [header]
    for row in rows:
        lines.append(
            (
                row.variant,
                row.version,
                f"{row.size_bytes / 1e6:.3f}",
                _num(row.b1_ms, ".3f"),
                _num(row.b32_ms, ".3f"),
                _num(row.max_abs, ".3g"),
                _num(row.p99_max_abs, ".3g"),
                _pct(row.top1),
                _pct(row.topk),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"
