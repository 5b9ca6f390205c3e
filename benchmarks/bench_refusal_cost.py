"""What a refusal costs next to an answer: server CPU per 429 vs per 200, same run (issue 10).

On one core, goodput at k times the capacity is bounded by what refusing the excess costs:
if a refusal costs a fraction r of a served request's CPU, the served fraction g of capacity
obeys g (1 - r) + k r <= 1 (the core is shared by g answers and k - g refusals per unit of
capacity), so g <= (1 - k r) / (1 - r). This script measures r for each demo MLP over HTTP
JSON (wrk) and gRPC (h2load), with copies of the models whose latency budget (1 us) refuses
every request at admission, so the refusals take exactly the edge path a real overload takes:
HTTP answers from the path and headers and drops the body, gRPC before decoding tensors.

Server on CPU 0 (``--intra-op-threads 1``), load on CPU 1, closed loop c=64, served and
refused runs alternating, medians over ``--rounds``. Writes benchmarks/out/refusal_cost.json.

    .venv/bin/python benchmarks/bench_refusal_cost.py --seconds 3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_grpc import INFER, WIDTHS, grpc_request
from h2load import run_h2load
from machine import stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
POST_LUA = Path(__file__).with_name("post.lua")
MULTIPLES = (2, 4, 8)


def repository(root: Path) -> Path:
    write_demo_repository(root)
    for folder in root.iterdir():
        if folder.name not in WIDTHS:
            shutil.rmtree(folder)
    for name in WIDTHS:
        copy = root / f"{name}_refusing"
        shutil.copytree(root / name, copy)
        config = (copy / "config.yaml").read_text()
        (copy / "config.yaml").write_text(config + "  latency_budget_ms: 0.001\n")
    return root


def cpu_s(server: ServerProcess) -> float:
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_run(server: ServerProcess, model: str, seconds: int) -> tuple[int, int, float]:
    """(answers, non-2xx, server CPU s) for wrk c=64 on CPU 1."""
    width = WIDTHS[model.removesuffix("_refusing")]
    body = {"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": [0.5] * width}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
        json.dump(body, handle)
        handle.flush()
        env = {
            **os.environ,
            "BODY": handle.name,
            "URL_PATH": f"/v2/models/{model}/infer",
            "HEADER_LENGTH": "",
        }
        command = ["taskset", "-c", "1", "wrk", "-t1", "-c64", f"-d{seconds}s", "-s", str(POST_LUA)]
        before = cpu_s(server)
        output = subprocess.run(
            [*command, server.http_url], env=env, capture_output=True, text=True, check=True
        ).stdout
        used = cpu_s(server) - before
    answers = int(output.split(" requests in ")[0].split()[-1])
    non_2xx = 0
    for line in output.splitlines():
        if "Non-2xx" in line:
            non_2xx = int(line.split()[-1])
    return answers, non_2xx, used


def grpc_run(server: ServerProcess, model: str, seconds: int) -> tuple[int, int, float]:
    width = WIDTHS[model.removesuffix("_refusing")]
    payload = grpc_request(model, width)
    before = cpu_s(server)
    run = run_h2load(f"http://{server.grpc_address}{INFER}", payload, 64, float(seconds))
    used = cpu_s(server) - before
    return run.completed, run.http_errors, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = repository(OUT / "refusal-models")
    server_args = ["--intra-op-threads", "1", "--metrics-port", "-1", "--log-level", "WARNING"]
    cells: dict[str, list[float]] = {}
    with run_server(repo, OUT / "refusal-server.log", server_args, pin_cpu=0) as server:
        for transport, run in (("http-json", http_run), ("grpc", grpc_run)):
            for model in WIDTHS:
                run(server, model, 1)  # warm both paths
                run(server, f"{model}_refusing", 1)
                for _ in range(args.rounds):
                    for name in (model, f"{model}_refusing"):
                        answers, failed, used = run(server, name, args.seconds)
                        key = f"{transport} {name}"
                        cells.setdefault(f"{key} us/request", []).append(1e6 * used / max(1, answers))
                        cells.setdefault(f"{key} refused share", []).append(failed / max(1, answers))
                        cells.setdefault(f"{key} req/s", []).append(answers / args.seconds)
    medians = {key: statistics.median(values) for key, values in cells.items()}
    rows = []
    for transport in ("http-json", "grpc"):
        for model in WIDTHS:
            served = medians[f"{transport} {model} us/request"]
            refused = medians[f"{transport} {model}_refusing us/request"]
            r = refused / served
            bounds = {k: max(0.0, (1 - k * r) / (1 - r)) for k in MULTIPLES}
            rows.append(
                {
                    "transport": transport,
                    "model": model,
                    "served_us": round(served, 1),
                    "refused_us": round(refused, 1),
                    "refused_share_of_refusing_runs": round(
                        medians[f"{transport} {model}_refusing refused share"], 3
                    ),
                    "r": round(r, 3),
                    "goodput_bound": {f"{k}x": round(b, 3) for k, b in bounds.items()},
                }
            )
    report = {"machine": stamp(), "args": vars(args), "cells": cells, "rows": rows}
    (OUT / "refusal_cost.json").write_text(json.dumps(report, indent=2))
    print(
        "| transport | model | server CPU per answer (us) | per refusal (us) | r | goodput bound 2x / 4x / 8x |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        bound = row["goodput_bound"]
        assert isinstance(bound, dict)
        print(
            f"| {row['transport']} | {row['model']} | {row['served_us']} | {row['refused_us']} | {row['r']} | "
            + " / ".join(f"{100 * v:.0f}%" for v in bound.values())
            + " |"
        )


if __name__ == "__main__":
    main()
