"""On-demand ONNX Runtime profiles of a served version: the operators that take the time.

ONNX Runtime turns its profiler on only when a session is created, so a profile builds a
second session of the version's graph (same file, same providers, the server's thread count)
with profiling on, runs it for N runs or N seconds on generated inputs, and reads back the
Chrome trace it writes: the live session keeps serving untouched. The trace files are kept
(the newest ``keep``) for chrome://tracing or Perfetto; each profile's per-operator times are
added to ``ortserve_ort_op_seconds_total``. ONNX Runtime is imported when a profile runs,
never at import (``--workers``' zygote forks before it is loaded).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ortserve.core.datatypes import datatype_of_ort, numpy_dtype
from ortserve.core.model import VersionInfo
from ortserve.errors import InvalidInput

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["MAX_RUNS", "MAX_SECONDS", "OpSeconds", "OpTime", "ProfileResult", "Profiler", "operator_times"]

MAX_RUNS = 10_000
MAX_SECONDS = 60.0
_MAX_INPUT_ELEMENTS = 1 << 24
"""Generated inputs stay under 64 MiB of float32 whatever the declared shapes."""


@dataclass(frozen=True, slots=True)
class OpTime:
    op_type: str
    seconds: float
    calls: int


@dataclass(frozen=True, slots=True)
class ProfileResult:
    runs: int
    wall_s: float
    trace: Path
    operators: list[OpTime]

    def answer(self, model: str, version: str, top: int = 15) -> dict[str, Any]:
        total = sum(op.seconds for op in self.operators) or 1.0
        return {
            "model": model,
            "version": version,
            "runs": self.runs,
            "wall_s": round(self.wall_s, 4),
            "trace_file": str(self.trace),
            "operators": [
                {
                    "op_type": op.op_type,
                    "seconds": round(op.seconds, 6),
                    "calls": op.calls,
                    "share": round(op.seconds / total, 4),
                }
                for op in self.operators[:top]
            ],
        }


def operator_times(events: list[dict[str, Any]]) -> list[OpTime]:
    """Kernel time per operator type from ONNX Runtime's Chrome trace, largest first."""
    seconds: dict[str, float] = {}
    calls: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        op = str(event.get("args", {}).get("op_name", "?"))
        seconds[op] = seconds.get(op, 0.0) + float(event.get("dur", 0)) / 1e6
        calls[op] += 1
    return [OpTime(op, total, calls[op]) for op, total in sorted(seconds.items(), key=lambda kv: -kv[1])]


class OpSeconds(Collector):
    """``ortserve_ort_op_seconds_total{model,version,op_type}``: kernel time seen by profiles."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str, str], float] = {}

    def add(self, model: str, version: str, operators: list[OpTime]) -> None:
        for op in operators:
            key = (model, version, op.op_type)
            self.totals[key] = self.totals.get(key, 0.0) + op.seconds

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "ortserve_ort_op_seconds",
            "ONNX Runtime kernel time by operator type, measured by on-demand profiles",
            labels=["model", "version", "op_type"],
        )
        for (model, version, op), value in sorted(self.totals.items()):
            family.add_metric([model, version, op], value)
        yield family


def _feeds(session: ort.InferenceSession, batch: int) -> dict[str, np.ndarray[Any, Any]]:
    feeds: dict[str, np.ndarray[Any, Any]] = {}
    rng = np.random.default_rng(0)
    for arg in session.get_inputs():
        dims = [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
        if dims and not (isinstance(arg.shape[0], int) and arg.shape[0] > 0):
            dims[0] = batch
        if int(np.prod(dims)) > _MAX_INPUT_ELEMENTS:
            raise InvalidInput(f"input {arg.name!r} of shape {dims} is too large to generate for a profile")
        datatype = datatype_of_ort(arg.type, arg.name)
        if datatype == "BYTES":
            raise InvalidInput("a model with string inputs cannot be profiled on generated inputs")
        dtype = numpy_dtype(datatype)
        values = rng.random(dims) if np.issubdtype(dtype, np.floating) else np.zeros(dims)
        feeds[arg.name] = values.astype(dtype)
    return feeds


class Profiler:
    """Runs profiles; one at a time is the caller's job (the route holds a lock).

    Args:
        repository: the model repository (the graph is read from ``<model>/<version>``).
        folder: where traces are written and kept.
        intra_op_threads: the profiling session's threads (the server's setting).
        op_seconds: the collector each profile feeds.
        keep: traces kept in ``folder``.
    """

    def __init__(
        self, repository: Path, folder: Path, intra_op_threads: int, op_seconds: OpSeconds, keep: int = 10
    ) -> None:
        self._repository = repository
        self._folder = folder
        self._threads = intra_op_threads
        self.op_seconds = op_seconds
        self._keep = keep

    def model_file(self, info: VersionInfo) -> Path:
        """Raises: InvalidInput when the version has no ONNX file of its own (a pipeline)."""
        folder = self._repository / info.name / info.version
        candidates = (
            [folder / "model.onnx"] if (folder / "model.onnx").is_file() else sorted(folder.glob("*.onnx"))
        )
        if not candidates or info.platform != "onnxruntime_onnx":
            raise InvalidInput(f"model {info.name!r} version {info.version} has no ONNX graph to profile")
        return candidates[0]

    def run(self, info: VersionInfo, runs: int, seconds: float, batch: int) -> ProfileResult:
        """Blocking: call it on a worker thread."""
        import onnxruntime as ort  # here: the zygote of --workers forks before any import of it

        path = self.model_file(info)
        self._folder.mkdir(parents=True, exist_ok=True)
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(self._folder / f"{info.name}-{info.version}-{int(time.time())}")
        options.intra_op_num_threads = self._threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = [p for p in info.providers if p in ort.get_available_providers()] or [
            "CPUExecutionProvider"
        ]
        session = ort.InferenceSession(str(path), options, providers=providers)
        feeds = _feeds(session, batch)
        started = time.perf_counter()
        done = 0
        while done < max(runs, 1) and (done == 0 or time.perf_counter() - started < seconds):
            session.run(None, feeds)
            done += 1
        wall = time.perf_counter() - started
        trace = Path(session.end_profiling())
        operators = operator_times(json.loads(trace.read_text(encoding="utf-8")))
        self.op_seconds.add(info.name, info.version, operators)
        self._prune()
        return ProfileResult(done, wall, trace, operators)

    def _prune(self) -> None:
        traces = sorted(self._folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in traces[: max(0, len(traces) - self._keep)]:
            old.unlink(missing_ok=True)
