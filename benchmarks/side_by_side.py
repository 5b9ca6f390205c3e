"""Two source trees measured in one run: both servers started at once on CPU 0, and the
per-round figures written with their medians (ab_grpc, ab_flood, bench_grpc_bomb)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from machine import stamp

from ortserve.testing import ServerProcess, run_server


def old_and_new(
    stack: ExitStack, repository: Path, logs: Path, name: str, server_args: list[str] | None, old_src: Path
) -> dict[str, ServerProcess]:
    """``{"old": ..., "new": ...}``: the ``old_src`` tree (through PYTHONPATH) and the installed
    package, both serving ``repository`` on CPU 0 until ``stack`` closes."""
    old_env = {"PYTHONPATH": str(old_src)}
    old = run_server(repository, logs / f"{name}-old.log", server_args, old_env, pin_cpu=0)
    return {
        "old": stack.enter_context(old),
        "new": stack.enter_context(run_server(repository, logs / f"{name}-new.log", server_args, pin_cpu=0)),
    }


def write_medians(
    out: Path,
    name: str,
    rounds: Mapping[str, Sequence[Mapping[str, object]]],
    keys: Sequence[str],
    **extra: object,
) -> dict[str, dict[str, float]]:
    """Median of each key per tree over the rounds (None counts as 0), written with the rounds
    and ``extra`` to ``out/<name>-<time>.json`` and printed."""
    medians = {
        label: {key: statistics.median(float(row[key] or 0.0) for row in rows) for key in keys}  # type: ignore[arg-type]
        for label, rows in rounds.items()
    }
    report = {"machine": stamp(), **extra, "rounds": rounds, "medians": medians}
    path = out / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(medians, indent=2))
    print(f"wrote {path}")
    return medians
