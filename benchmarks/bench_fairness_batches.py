"""The arithmetic behind a quiet tenant's p99 beside a flood (issue 32.5): how long one batch of
the flood runs, by size, and what a quiet request pays when it runs beside one on the same core.

With one core for ONNX Runtime (``--intra-op-threads 1``, the server pinned), a session run is
not preempted: a quiet request that arrives while a batch of the flood runs waits for the rest
of it. Its latency is then (the running batch's remainder) + (its own run) + the server's
overhead, against (its own run) + overhead alone. This measures the parts, in process, on the
session the server would build (intra-op 1, no spinning):

1. ``T(b)``: one run of a batch of ``b`` rows, median and 99th percentile (wall) and median CPU
   of the calling thread (ONNX Runtime runs on it with one intra-op thread, so the CPU figure
   holds on a shared machine where the wall one does not);
2. two sessions of the model on one core at once (``instance_group`` count 2): the wall time
   of a batch of 1, alone and while another thread runs batches of ``--flood-rows`` on the
   other session (blocks of each alternated); both threads SCHED_BATCH as the runner's
   workers, the flood's at each ``--flood-nice`` (0: the old runner; 19: its bulk lane,
   ``runner.BULK_NICE``), and the quiet thread's CPU time per run beside its wall time (the
   difference is the time it was runnable but the flood's thread, or another process, had
   the core).

Run pinned to one core:

    taskset -c 0 .venv/bin/python benchmarks/bench_fairness_batches.py --model heavy_mlp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortserve.demo import DEMO_MODELS, build_mlp


def _session(model: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _feeds(width: int, rows: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(rows).random((rows, width), dtype=np.float32)}


def batch_times(session: ort.InferenceSession, width: int, rows: int, runs: int) -> dict[str, float]:
    feeds = _feeds(width, rows)
    for _ in range(3):
        session.run(None, feeds)
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.thread_time()
        session.run(None, feeds)
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {
        "wall_p50_ms": round(statistics.median(walls) * 1e3, 3),
        "wall_p99_ms": round(float(np.percentile(walls, 99)) * 1e3, 3),
        "cpu_p50_ms": round(statistics.median(cpus) * 1e3, 3),
    }


def _batch_policy(nice: int = 0) -> None:
    """This thread as the runner's workers have it: SCHED_BATCH, at ``nice`` (Linux)."""
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def shared_core(
    model: Path, width: int, flood_rows: int, runs: int, nice: int
) -> dict[str, dict[str, float]]:
    """A batch of 1 on one session, alone and while another session (another thread, the same
    core, at ``nice``) runs batches of ``flood_rows`` in a loop: blocks of 10 runs alternate
    between the two, so the machine's other load falls on both alike."""
    quiet, flood = _session(model), _session(model)
    feeds_1, feeds_n = _feeds(width, 1), _feeds(width, flood_rows)
    quiet.run(None, feeds_1)
    flood.run(None, feeds_n)
    stop, flooding = threading.Event(), threading.Event()

    def flood_loop() -> None:
        _batch_policy(nice)
        while not stop.is_set():
            if flooding.wait(0.01):
                flood.run(None, feeds_n)

    thread = threading.Thread(target=flood_loop)
    thread.start()
    walls: dict[str, list[float]] = {"alone": [], "beside the flood": []}
    cpus: dict[str, list[float]] = {"alone": [], "beside the flood": []}
    try:
        for block in range(2 * max(1, runs // 10)):
            arm = "beside the flood" if block % 2 else "alone"
            if block % 2:
                flooding.set()
                time.sleep(0.03)
            else:
                flooding.clear()
                time.sleep(0.03)  # the flood's batch running ends
            for _ in range(10):
                started, cpu = time.perf_counter(), time.thread_time()
                quiet.run(None, feeds_1)
                walls[arm].append(time.perf_counter() - started)
                cpus[arm].append(time.thread_time() - cpu)
                time.sleep(0.003 + 0.007 * np.random.default_rng(len(walls[arm])).random())
    finally:
        stop.set()
        flooding.set()
        thread.join()
    return {
        arm: {
            "wall_p50_ms": round(statistics.median(values) * 1e3, 3),
            "wall_p99_ms": round(float(np.percentile(values, 99)) * 1e3, 3),
            "cpu_p50_ms": round(statistics.median(cpus[arm]) * 1e3, 3),
            "runnable_not_running_mean_ms": round((sum(values) - sum(cpus[arm])) / len(values) * 1e3, 3),
        }
        for arm, values in walls.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="heavy_mlp", choices=sorted(DEMO_MODELS))
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--flood-rows", type=int, default=32)
    parser.add_argument("--flood-nice", type=int, nargs="+", default=[0, 19])
    parser.add_argument("--rounds", type=int, default=1, help="the --flood-nice arms alternated")
    parser.add_argument("--no-sizes", action="store_true", help="skip the batch times by size")
    args = parser.parse_args()
    sizes, seed = DEMO_MODELS[args.model]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(build_mlp(sizes, seed, args.model).SerializeToString())
        session = _session(path)
        result: dict[str, object] = {"model": args.model, "load average before": os.getloadavg()}
        _batch_policy()  # the quiet thread, as a worker
        if not args.no_sizes:
            result["batch"] = {
                rows: batch_times(session, sizes[0], rows, args.runs) for rows in (1, 2, 4, 8, 16, 32)
            }
        for round_ in range(args.rounds):
            for nice in args.flood_nice:
                key = f"round {round_ + 1}: batch of 1 beside a second session running batches of {args.flood_rows} at nice {nice}"
                result[key] = shared_core(path, sizes[0], args.flood_rows, args.runs, nice)
        result["load average after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
