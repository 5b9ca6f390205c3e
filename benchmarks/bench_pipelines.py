"""Pipeline benchmark: each seed route vs its ONNX model alone (OIP infer), c = 1 and 64.

Server pinned to CPU 0 with one intra-op thread; wrk pinned to CPU 1. The pipeline and its
model alone are measured in alternation (A, B, A, B, ...) so drift on a shared machine hits
both; each cell is the median of ``--repeats`` runs. The model-alone body carries exactly the
features the pipeline would compute for the same request. Also times, in process, each
pipeline's Python steps (best of 5) and one step inline vs behind a thread hop (the runtime's
inline/thread decision). Writes a JSON
stamped with machine, versions and git revision, and prints Markdown for benchmarks/RESULTS.md.

    python benchmarks/bench_pipelines.py --seconds 5 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp
from wrk import WrkResult, run_wrk

from ortserve.apps.dispatch.features import pair_features
from ortserve.apps.dispatch.pipeline import DispatchPipeline
from ortserve.apps.dispatch.request import parse_dispatch_request
from ortserve.apps.hotword.pipeline import HotwordPipeline
from ortserve.demo import write_demo_repository
from ortserve.pipeline.contract import PipelineContext
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
NOW = 1_759_017_600_000
PREDICT = {"query": "国庆旅游攻略", "region_id": 110000, "timestamp": NOW}


def route_document(orders: int = 10, couriers: int = 5) -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "now": NOW,
        "orders": [
            {"id": f"o{i}", "lat": 39.9 + rng.uniform(0, 0.05), "lon": 116.4 + rng.uniform(0, 0.05),
             "created_at": NOW, "deadline": NOW + int(rng.integers(20, 90)) * 60_000}
            for i in range(orders)
        ],
        "couriers": [
            {"id": f"c{j}", "lat": 39.9 + rng.uniform(0, 0.05), "lon": 116.4 + rng.uniform(0, 0.05),
             "capacity": 4, "load": int(rng.integers(0, 3))}
            for j in range(couriers)
        ],
    }  # fmt: skip


def oip_body(name: str, rows: np.ndarray) -> bytes:
    tensor = {"name": name, "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def targets(repo: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (path, body); each pipeline next to its model fed the same features."""
    hotword = HotwordPipeline(PipelineContext("hotword", "1", repo / "hotword" / "1"))
    [call] = hotword.preprocess(hotword.parse(PREDICT))
    route = route_document()
    pairs = pair_features(parse_dispatch_request(route, NOW)).rows
    return {
        "hotword pipeline": ("/v1/predict", json.dumps(PREDICT).encode()),
        "hotword model": (
            "/v2/models/hotword/infer",
            oip_body("features", np.asarray(call.inputs["features"])),
        ),
        "dispatch pipeline": ("/v1/route", json.dumps(route).encode()),
        "dispatch model": ("/v2/models/dispatch/infer", oip_body("pairs", pairs)),
    }


def thread_hop(repo: Path, rounds: int = 3000) -> dict[str, float]:
    """Median microseconds of the hotword preprocess step inline vs through asyncio.to_thread."""
    pipeline = HotwordPipeline(PipelineContext("hotword", "1", repo / "hotword" / "1"))
    request = pipeline.parse(PREDICT)

    async def measure(call: Callable[[], object]) -> float:
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            await call()  # type: ignore[misc]
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    async def inline() -> object:
        return pipeline.preprocess(request)

    async def hop() -> object:
        return await asyncio.to_thread(pipeline.preprocess, request)

    async def both() -> dict[str, float]:
        return {"inline_us": await measure(inline), "thread_us": await measure(hop)}

    os.sched_setaffinity(0, {0})
    try:
        return asyncio.run(both())
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


def time_steps(
    app: str, pipeline: Any, document: dict[str, object], repo: Path, rounds: int
) -> dict[str, float]:
    body = json.dumps(document).encode()
    request = pipeline.parse(orjson.loads(body))
    [call] = pipeline.preprocess(request)
    session = ort.InferenceSession(str(repo / app / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    outputs = [dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(call.inputs))))]
    steps: dict[str, Callable[[], object]] = {
        "parse": lambda: pipeline.parse(orjson.loads(body)),
        "preprocess": lambda: pipeline.preprocess(request),
        "postprocess": lambda: orjson.dumps(pipeline.postprocess(outputs, request)),
    }
    return {
        f"{app}/{step}": min(timeit.repeat(run, number=rounds, repeat=5)) / rounds * 1e6
        for step, run in steps.items()
    }


def step_costs(repo: Path, rounds: int = 300) -> dict[str, float]:
    """Best-of-5 mean microseconds of each Python step of both pipelines, in process on CPU 0;
    robust to a shared machine's noise where wrk's c=1 p50 is not."""
    hotword = HotwordPipeline(PipelineContext("hotword", "1", repo / "hotword" / "1"))
    dispatch = DispatchPipeline(PipelineContext("dispatch", "1", repo / "dispatch" / "1"))
    os.sched_setaffinity(0, {0})
    try:
        return {
            **time_steps("hotword", hotword, PREDICT, repo, rounds),
            **time_steps("dispatch", dispatch, route_document(), repo, rounds),
        }
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


def median_result(results: list[WrkResult]) -> dict[str, float]:
    keys = results[0].as_dict().keys()
    return {k: statistics.median(r.as_dict()[k] for r in results) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = OUT / "pipeline-models"
    if not (repo / "dispatch").exists():
        write_demo_repository(repo)
    report: dict[str, object] = {
        **machine_stamp(),
        "intra_op_threads": 1, "server_cpu": 0, "load_cpu": 1, "seconds": args.seconds, "repeats": args.repeats,
        "thread_hop": thread_hop(repo), "steps_us": step_costs(repo), "server": {},
    }  # fmt: skip
    print("thread hop", report["thread_hop"], "steps", report["steps_us"], flush=True)
    bodies = targets(repo)
    server_args = ["--intra-op-threads", "1", "--grpc-port", "-1", "--metrics-port", "-1"]
    with run_server(repo, OUT / "pipelines-server.log", server_args) as server:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", "0", str(server.process.pid)], check=True, capture_output=True
        )
        for path, payload in bodies.values():
            run_wrk(server.http_url, path, payload, 8, 1)  # warm
        for app in ("hotword", "dispatch"):
            for concurrency in args.concurrency:
                runs: dict[str, list[WrkResult]] = {f"{app} pipeline": [], f"{app} model": []}
                for _ in range(args.repeats):
                    for name in runs:
                        path, payload = bodies[name]
                        runs[name].append(run_wrk(server.http_url, path, payload, concurrency, args.seconds))
                for name, results in runs.items():
                    report["server"][f"{name}/c{concurrency}"] = median_result(results)  # type: ignore[index]
                    print(name, concurrency, report["server"][f"{name}/c{concurrency}"], flush=True)  # type: ignore[index]
    (OUT / f"pipelines-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=2))
    print_table(report)


def print_table(report: dict[str, object]) -> None:
    server: dict[str, dict[str, float]] = report["server"]  # type: ignore[assignment]
    print(f"\n{report['date']} | {report['cpu']} | ORT {report['onnxruntime']} | git {report['git']} | "
          f"median of {report['repeats']} x {report['seconds']} s, pipeline and model alternated\n")  # fmt: skip
    print("| target | concurrency | req/s | p50 ms | p99 ms | errors | p50 added by the pipeline |")
    print("|---|---|---|---|---|---|---|")
    for key, cell in server.items():
        name, conc = key.split("/c")
        added = ""
        if name.endswith("pipeline"):
            model = server[f"{name.replace('pipeline', 'model')}/c{conc}"]
            added = f"{cell['p50_ms'] - model['p50_ms']:+.3f} ms"
        print(f"| {name} | {conc} | {cell['requests_per_s']:.0f} | {cell['p50_ms']:.3f} | {cell['p99_ms']:.2f} | "
              f"{cell['errors']:.0f} | {added} |")  # fmt: skip
    hop = report["thread_hop"]
    print(
        f"\nhotword preprocess in process: inline {hop['inline_us']:.1f} us, "  # type: ignore[index]
        f"through asyncio.to_thread {hop['thread_us']:.1f} us (median)"
    )  # type: ignore[index]


if __name__ == "__main__":
    main()
