"""Intake back-pressure on and off, side by side (issue 10): the same overload points against
a server with the default ``--intake-lag-ms`` and one with it off (0), alternating.

Server on CPU 0 (``--intra-op-threads 1``), the native open-loop generator on CPU 1; points:
small_mlp HTTP JSON open loop at 2x and 4x the closed-loop capacity, heavy_mlp gRPC at 4x,
and 3,000 connections in a closed loop on small_mlp. Writes benchmarks/out/ab_intake.json.

    .venv/bin/python benchmarks/ab_intake.py --seconds 5 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_overload import OUT, closed_native, repository, sweep
from machine import stamp

from ortserve.testing import run_server

POINTS = (("small_mlp", "http-json", (2, 4)), ("heavy_mlp", "grpc", (4,)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    root = repository(OUT / "ab-intake-models")
    results: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for label, extra in (("intake-on", []), ("intake-off", ["--intake-lag-ms", "0"])):
            server_args = ["--intra-op-threads", "1", *extra]
            with run_server(root, OUT / f"ab-intake-{label}.log", server_args, pin_cpu=0) as server:
                for model, transport, multiples in POINTS:
                    capacity = closed_native(server, model, transport, 64, args.seconds)
                    for row in sweep(server, model, transport, capacity["goodput"], args.seconds, multiples):
                        row["capacity"] = capacity["goodput"]
                        key = f"{label} {model} {transport} {row['multiple']}x"
                        results.setdefault(key, []).append(row)
                row = closed_native(server, "small_mlp", "http-json", 3000, args.seconds)
                results.setdefault(f"{label} small_mlp c3000", []).append(row)
            print(f"round {round_ + 1} {label} done", flush=True)
    (OUT / "ab_intake.json").write_text(
        json.dumps({"machine": stamp(), "args": vars(args), "results": results}, indent=2)
    )
    print("| point | intake | goodput / capacity | admitted p99 ms | refused p99 ms | timeouts |")
    print("|---|---|---|---|---|---|")
    for key, rows in sorted(results.items()):
        label, point = key.split(" ", 1)
        for row in rows:
            capacity = row.get("capacity")
            share = f"{100 * row['goodput'] / capacity:.0f}%" if capacity else f"{row['goodput']:.0f}/s"
            print(
                f"| {point} | {label} | {share} | {row['admitted_p99_ms']} | {row['refused_p99_ms']} | "
                f"{row.get('timeouts', '')} |"
            )


if __name__ == "__main__":
    main()
