"""A gRPC refusal's CPU on the wire, against a served call's (issue 30, item 4): r for the bound.

The goodput bound on one core, g <= (1 - k r) / (1 - r) (``bench_refusal_cost.py``), needs r =
the server's CPU per refused call over its CPU per served call. Here the native generator
(``benchmarks/openloop``, closed loop, on CPU 1) drives unary ModelInfer calls at a server on
CPU 0 (``--intra-op-threads 1``): against copies of the demo MLPs whose 1 us latency budget
refuses every call at admission (the edge path a real overload takes), and against the models
themselves (served). Shapes: 64 connections x 1 stream (one call per read, as at 1,600
connections) and 4 x 16 (several calls per read). Server CPU per call from /proc; with
``--old-src`` an older source tree is measured too, arms alternating round by round; medians.

    .venv/bin/python benchmarks/bench_refusal_grpc_wire.py --rounds 3 --seconds 3 --old-src /tmp/old/src

Writes benchmarks/out/refusal_grpc_wire.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import machine
from bench_overload import server_cpu_s, wire
from bench_refusal_cost import repository
from openloop.run import run_openloop

from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
SHAPES = ((64, 1), (4, 16))
REFUSED = "1008"  # RESOURCE_EXHAUSTED, as the generator records gRPC statuses


def per_call(
    server: ServerProcess, model: str, connections: int, streams: int, seconds: float
) -> dict[str, Any]:
    """Server CPU per call, and how the calls ended, for one closed-loop run."""
    request = wire(server, model, "grpc")
    before = server_cpu_s(server)
    summary = run_openloop(
        request.target, request.data, 0, seconds, connections, 1, 5.0,
        grpc_path=request.grpc_path, streams=streams, warmup_s=0.5,
    )  # fmt: skip
    used = server_cpu_s(server) - before
    return {
        "us_per_call": round(1e6 * used / summary.completed, 2) if summary.completed else None,
        "calls_per_s": round(summary.achieved_rate),
        "statuses": summary.statuses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--models", default="small_mlp,heavy_mlp")
    parser.add_argument("--new-src", type=Path, help="source tree of the new arm (default: this checkout)")
    parser.add_argument("--old-src", type=Path, help="also measure this source tree (PYTHONPATH)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = repository(OUT / "refusal-grpc-models")
    server_args = ["--intra-op-threads", "1", "--log-level", "WARNING"]
    trees = {"new": args.new_src}
    if args.old_src is not None:
        trees["old"] = args.old_src
    cells: dict[str, list[float]] = {}
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                run_server(
                    repo,
                    OUT / f"refusal-grpc-{name}.log",
                    server_args,
                    pin_cpu=0,
                    env=None if tree is None else {"PYTHONPATH": str(tree.resolve())},
                )
            )
            for name, tree in trees.items()
        }
        for number in range(args.rounds):
            order = list(servers.items()) if number % 2 == 0 else list(servers.items())[::-1]
            for name, server in order:
                for model in args.models.split(","):
                    for connections, streams in SHAPES:
                        for kind in ("refused", "served"):
                            if kind == "served" and streams == 1:
                                continue  # the capacity is measured with several calls per read
                            target = f"{model}_refusing" if kind == "refused" else model
                            row = per_call(server, target, connections, streams, args.seconds)
                            if kind == "refused":
                                assert set(row["statuses"]) == {REFUSED}, row["statuses"]
                            key = f"{name}/{model}/{kind}/{connections}x{streams}"
                            cells.setdefault(key, []).append(row["us_per_call"])
                            rows.append({"round": number, "key": key, **row})
                            print(key, row, flush=True)
    medians = {key: round(statistics.median(v), 2) for key, v in cells.items() if None not in v}
    report = {"machine": machine.stamp(), "args": vars(args) | {"old_src": str(args.old_src), "new_src": str(args.new_src)}, "rows": rows, "medians": medians}  # fmt: skip
    (OUT / "refusal_grpc_wire.json").write_text(json.dumps(report, indent=2, default=str))
    print("server CPU per call, medians (us):")
    for key, value in medians.items():
        print(f"  {key}: {value}")
    for name in trees:
        for model in args.models.split(","):
            served = medians.get(f"{name}/{model}/served/4x16")
            for connections, streams in SHAPES:
                refused = medians.get(f"{name}/{model}/refused/{connections}x{streams}")
                if served and refused:
                    r = refused / served
                    bounds = ", ".join(f"{k}x {max(0.0, (1 - k * r) / (1 - r)):.2f}" for k in (2, 4, 8))
                    print(f"  {name} {model} {connections}x{streams}: r = {r:.3f}; bound {bounds}")


if __name__ == "__main__":
    main()
