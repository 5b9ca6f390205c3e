"""Queue-wait target side by side (issue 10, item 3): the automatic target against fixed ones.

The automatic target (``batching.max_queue_wait_ms`` unset) bounds the predicted queueing wait
a request may be admitted with. Its size trades admitted latency against goodput: too small and
the runner idles between batches, too large and every admitted request waits for it. This runs
copies of heavy_mlp that differ only in ``max_queue_wait_ms`` in one server (CPU 0,
``--intra-op-threads 1``) under open-loop overload from the native generator (CPU 1), arms
alternating within each round, and reports medians of goodput / capacity and admitted p99.

    .venv/bin/python benchmarks/ab_queue_wait.py --seconds 5 --rounds 2 --waits 50,30
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_overload import OUT, closed_native, sweep
from machine import stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import run_server

MODEL = "heavy_mlp"


def repository(root: Path, waits_ms: list[float]) -> list[str]:
    """heavy_mlp as it is (automatic target) and one copy per fixed target; returns the names."""
    if root.exists():
        shutil.rmtree(root)
    write_demo_repository(root)
    for folder in root.iterdir():
        if folder.name != MODEL:
            shutil.rmtree(folder)
    names = [MODEL]
    for wait in waits_ms:
        name = f"{MODEL}_wait{wait:g}".replace(".", "_")
        shutil.copytree(root / MODEL, root / name)
        config = (root / name / "config.yaml").read_text()
        (root / name / "config.yaml").write_text(config + f"  max_queue_wait_ms: {wait}\n")
        names.append(name)
    return names


def median(rows: list[dict], field: str) -> float:
    values = [r[field] for r in rows if r.get(field) is not None]
    return round(statistics.median(values), 1) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--waits", default="50,30", help="fixed targets in ms, comma-separated")
    parser.add_argument("--multiples", default="2,4")
    parser.add_argument("--transports", default="http-json,grpc")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    names = repository(OUT / "ab-wait-models", [float(w) for w in args.waits.split(",")])
    multiples = tuple(int(m) for m in args.multiples.split(","))
    cells: dict[str, list[dict]] = {}
    with run_server(
        OUT / "ab-wait-models", OUT / "ab-wait.log", ["--intra-op-threads", "1"], pin_cpu=0
    ) as server:
        for transport in args.transports.split(","):
            capacity = closed_native(server, MODEL, transport, 64, args.seconds)
            cells.setdefault(f"{transport} capacity", []).append(capacity)
            for round_ in range(args.rounds):
                order = names if round_ % 2 == 0 else list(reversed(names))
                for name in order:
                    for row in sweep(server, name, transport, capacity["goodput"], args.seconds, multiples):
                        row["capacity"] = capacity["goodput"]
                        row["capacity_p99_ms"] = capacity["admitted_p99_ms"]
                        cells.setdefault(f"{transport} {name} {row['multiple']}x", []).append(row)
    report = {"machine": stamp(), "args": vars(args), "cells": cells}
    (OUT / "ab_queue_wait.json").write_text(json.dumps(report, indent=2))
    print(
        "| transport | arm | load | goodput / capacity | admitted p50 ms | admitted p99 ms | refused p99 ms | capacity p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, rows in cells.items():
        if key.endswith("capacity"):
            continue
        transport, name, load = key.split(" ")
        share = statistics.median(r["goodput"] / r["capacity"] for r in rows)
        print(
            f"| {transport} | {name} | {load} | {100 * share:.0f}% | {median(rows, 'admitted_p50_ms')} | "
            f"{median(rows, 'admitted_p99_ms')} | {median(rows, 'refused_p99_ms')} | "
            f"{median(rows, 'capacity_p99_ms')} |"
        )


if __name__ == "__main__":
    main()
