"""Instructions per gRPC call of a guarded model against a plain one, counted by callgrind.

One server under ``valgrind --tool=callgrind --instr-atstart=no`` (CPU 0, one intra-op thread)
serves small_mlp as ``plain``, ``plain2`` (the A/A control) and ``guarded`` (the configs of
``bench_resilience.py overhead``). For each model and each concurrency (1 and 64), h2load
(CPU 1) sends ``--calls`` and then ``2 * --calls`` calls while callgrind counts; instructions
per call are the difference over ``--calls``, so what a run pays once drops out. Under
valgrind the server runs some 50x slower, so at c=64 every batch is full (32 rows) for every
model: the counts compare the per-request and per-batch work of the paths, not the batching
dynamics (rows per batch, inline or worker), which ``bench_resilience.py overhead`` reads.
Each dump is kept, for ``callgrind_annotate`` by function.

    python benchmarks/count_resilience.py --tree before=/tmp/old/src --tree after=src --calls 400

Writes JSON under benchmarks/out/.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_resilience import ARMS, grpc_body, write_arms
from count_grpc import callgrind_server, counted, h2load_calls, write_report

OUT = Path(__file__).parent / "out"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def measure_tree(
    label: str, src: Path, repo: Path, calls: int, out_dir: Path, concurrencies: list[int]
) -> dict[str, float]:
    with callgrind_server(label, src, repo, out_dir) as (process, server):
        url = f"http://{server.grpc_address}{INFER}"
        result: dict[str, float] = {}
        for model in ARMS:
            h2load_calls(url, grpc_body(model), 100, 16)  # warm
        for concurrency in concurrencies:
            for model in ARMS:
                body = grpc_body(model)
                name = f"{label}-{model}-c{concurrency}"
                counts = [
                    counted(
                        process.pid,
                        out_dir,
                        f"{name}-{n}",
                        partial(h2load_calls, url, body, n, concurrency),
                    )
                    for n in (calls, 2 * calls)
                ]
                result[f"{model}_c{concurrency}_ir_per_call"] = (counts[1] - counts[0]) / calls
                print(
                    label,
                    model,
                    f"c={concurrency}",
                    f"{result[f'{model}_c{concurrency}_ir_per_call']:,.0f}",
                    flush=True,
                )
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a src/ folder")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir = OUT / f"count_resilience-{stamp}"
    out_dir.mkdir()
    repo = out_dir / "models"
    write_arms(repo)
    trees = dict(item.split("=", 1) for item in args.tree)
    results = {
        label: measure_tree(label, Path(src).resolve(), repo, args.calls, out_dir, args.concurrency)
        for label, src in trees.items()
    }
    for found in results.values():
        for concurrency in args.concurrency:
            plain = found[f"plain_c{concurrency}_ir_per_call"]
            for arm in ("plain2", "guarded"):
                found[f"{arm}_minus_plain_c{concurrency}"] = (
                    found[f"{arm}_c{concurrency}_ir_per_call"] - plain
                )
    write_report(out_dir / "count_resilience.json", args, trees, results)


if __name__ == "__main__":
    main()
