"""Results as a table and a JSON document stamped with versions/machine/settings."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ortserve import __version__
from ortserve.loadtest.measurement import Measurement
from ortserve.loadtest.slo import Verdict

__all__ = [
    "PERCENTILES",
    "LevelResult",
    "environment_stamp",
    "render_table",
    "render_verdicts",
    "result_document",
]

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One level of a run: its label, its x value for plots, and what it measured."""

    label: str
    x: float
    measurement: Measurement


def summary(measurement: Measurement) -> dict[str, object]:
    """The headline figures of one level (latencies in milliseconds)."""
    latency = measurement.latency
    figures: dict[str, object] = {
        "requests": measurement.requests,
        "elapsed_s": round(measurement.elapsed_s, 3),
        "achieved_rate": round(measurement.achieved_rate, 1),
        "errors": measurement.errors,
        "error_rate": measurement.error_rate,
        "statuses": {_status_name(s): c for s, c in sorted(measurement.statuses.items())},
        "latency_ms": {f"p{p:g}": latency.percentile(p) / 1000 for p in PERCENTILES}
        | {"max": latency.max_value / 1000, "mean": round(latency.mean() / 1000, 4)},
        "latency_precision": latency.relative_precision,
        "interrupted": measurement.interrupted,
        "generator_cpu_cores": round(measurement.generator_cores, 3),
    }
    if measurement.refused.total:
        refused = measurement.refused
        figures["refused_latency_ms"] = {f"p{p:g}": refused.percentile(p) / 1000 for p in PERCENTILES}
    if measurement.send_lag.total:
        figures["send_lag_p99_ms"] = measurement.send_lag.percentile(99) / 1000
    return figures


_GRPC_CODES = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
]


def _status_name(status: int) -> str:
    """HTTP statuses as numbers; gRPC codes (recorded as 1000 + code) and client failures by name."""
    if 1000 <= status < 1000 + len(_GRPC_CODES):
        return f"grpc_{_GRPC_CODES[status - 1000]}"
    return {0: "connection_error", 1: "timeout"}.get(status, str(status))


def render_table(results: list[LevelResult]) -> str:
    """A fixed-width table: one row per level."""
    header = f"{'level':<20} {'req':>8} {'rate/s':>9} {'p50':>8} {'p90':>8} {'p99':>8} {'p99.9':>8} {'max':>8}  errors"
    lines = [header + "   (latency in ms)", "-" * len(header)]
    for result in results:
        m = result.measurement
        cells = [m.latency.percentile(p) / 1000 for p in PERCENTILES] + [m.latency.max_value / 1000]
        errors = ", ".join(
            f"{_status_name(s)}: {c}" for s, c in sorted(m.statuses.items()) if not 200 <= s < 300
        )
        mark = " (interrupted)" if m.interrupted else ""
        lines.append(
            f"{result.label:<20} {m.requests:>8} {m.achieved_rate:>9,.1f} "
            + " ".join(f"{c:>8.3f}" for c in cells)
            + f"  {errors or 'none'}{mark}"
        )
    return "\n".join(lines)


def render_verdicts(verdicts: list[Verdict]) -> str:
    """One line per objective and level: PASS/FAIL, measured against the limit."""
    lines = []
    for verdict in verdicts:
        objective = verdict.objective
        if objective.metric == "error_rate":
            measured = f"{verdict.measured:.4%}"
        elif objective.metric == "rate":
            measured = f"{verdict.measured:,.1f}/s"
        else:
            measured = f"{verdict.measured / 1000:.3f}ms"
        lines.append(
            f"SLO {objective.text:<22} {verdict.level:<20} {measured:>12}  {'PASS' if verdict.ok else 'FAIL'}"
        )
    return "\n".join(lines)


def environment_stamp() -> dict[str, object]:
    """Versions, machine and time, so a result file says where it came from."""
    return {
        "ortserve": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "hostname": socket.gethostname(),
        "git_revision": _git_revision(),
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_revision() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def result_document(
    command: str, settings: dict[str, object], results: list[LevelResult], verdicts: list[Verdict]
) -> bytes:
    """The JSON result: stamp, settings, per-level summary and histogram, SLO verdicts."""
    document = {
        "command": command,
        "environment": environment_stamp(),
        "settings": settings,
        "levels": [
            {
                "label": r.label,
                "x": r.x,
                "summary": summary(r.measurement),
                "histogram": r.measurement.latency.to_dict(),
            }
            for r in results
        ],
        "slo": [
            {
                "objective": v.objective.text,
                "level": v.level,
                "measured": v.measured,
                "limit": v.objective.limit,
                "ok": v.ok,
            }
            for v in verdicts
        ],
        "slo_ok": all(v.ok for v in verdicts),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)
