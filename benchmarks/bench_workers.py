"""Worker processes (``--workers N``): throughput, server CPU per request, and memory (PSS).

Two measurements, each with every server started here, side by side in one run:

* ``scaling``: small_mlp (JSON over HTTP, closed loop) against ``--workers N`` for each N in
  ``--workers``, the server on CPUs ``--server-cpus`` and the load generator (``ortserve
  bench``, its own processes) on ``--client-cpus``. Reports req/s and the server's CPU time
  per request, summed over the supervisor and every worker from /proc/<pid>/stat.
* ``memory``: a model of ``--model-mb`` MB whose weights are external data with
  ``prepack_weights: false`` (memory-mapped, shared), served by 1, 2 and 4 workers; total PSS
  (``/proc/<pid>/smaps_rollup``) of the workers, and of the supervisor.

On this 2-core machine:   python benchmarks/bench_workers.py scaling --workers 1,2 --server-cpus 0 --client-cpus 1
                          python benchmarks/bench_workers.py memory --model-mb 256
On a 16-core machine:     python benchmarks/bench_workers.py scaling --workers 1,2,4,8 \\
                              --server-cpus 0-7 --client-cpus 8-15 --processes 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from machine import stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import run_server

_TICK = os.sysconf("SC_CLK_TCK")


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (the supervisor and its workers)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            found.extend(_family(int(child)))
    return found


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def _workers_ready(server_metrics_url: str, n: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server_metrics_url, timeout=10) as reply:
                text = reply.read().decode()
            if n == 1 or f"ortserve_workers_ready {float(n)}" in text:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("workers not ready")


def scaling(args: argparse.Namespace) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    write_demo_repository(root / "models")
    results: dict[str, list[dict[str, object]]] = {}
    for _ in range(args.rounds):
        for n in args.workers:
            extra = ["--workers", str(n), "--shutdown-delay", "0"]
            with run_server(root / "models", root / f"server-{n}.log", extra) as server:
                _workers_ready(f"http://127.0.0.1:{server.metrics_port}/metrics", n)
                # run_server started `python -m ortserve`; re-pin that process tree now.
                pids = _family(server.process.pid)
                for pid in pids:
                    subprocess.run(
                        ["taskset", "-a", "-p", "-c", args.server_cpus, str(pid)], capture_output=True
                    )
                out = root / f"bench-{n}.json"
                command = [
                    "taskset", "-c", args.client_cpus,
                    sys.executable, "-m", "ortserve", "bench", server.http_url, "-m", "small_mlp",
                    "-c", str(args.concurrency), "-d", str(args.duration), "--warmup", "2",
                    "-p", str(args.processes), "-o", str(out), "--no-progress",
                ]  # fmt: skip
                before = _cpu_seconds(pids)
                subprocess.run(command, check=True, capture_output=True)
                cpu = _cpu_seconds(pids) - before
                level = json.loads(out.read_text())["levels"][0]["summary"]
                served = level["requests"]
                results.setdefault(str(n), []).append(
                    {
                        "req_per_s": level["achieved_rate"],
                        "p50_ms": level["latency_ms"]["p50"],
                        "p99_ms": level["latency_ms"]["p99"],
                        # CPU over warm-up + measurement, divided by the measured requests:
                        # a ratio between worker counts, not an absolute cost.
                        "server_cpu_ms_per_request": 1000 * cpu / max(served, 1) / (1 + 2 / args.duration),
                        "errors": level["errors"],
                        "statuses": level["statuses"],
                    }
                )
    medians = {
        n: {k: statistics.median(float(r[k]) for r in runs) for k in runs[0] if k != "statuses"}  # type: ignore[arg-type]
        for n, runs in results.items()
    }
    return {"runs": results, "medians": medians}


def _big_model(folder: Path, megabytes: int) -> None:
    """An MLP of ``megabytes`` MB of FP32 weights stored as external data, not prepacked."""
    width = 4096
    layers = max(1, round(megabytes * 1024 * 1024 / (width * width * 4)))
    rng = np.random.default_rng(0)
    nodes, initializers, current = [], [], "x"
    for index in range(layers):
        weight = f"w{index}"
        initializers.append(
            numpy_helper.from_array(rng.standard_normal((width, width), np.float32) * 0.01, weight)
        )
        out = "y" if index == layers - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [current, weight], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    version = folder / "big" / "1"
    version.mkdir(parents=True)
    onnx.save(model, str(version / "model.onnx"), save_as_external_data=True, location="weights.bin")
    (folder / "big" / "config.yaml").write_text("prepack_weights: false\nbatching:\n  max_batch_size: 8\n")


def memory(args: argparse.Namespace) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bench-workers-pss-"))
    _big_model(root / "models", args.model_mb)
    weights = (root / "models" / "big" / "1" / "weights.bin").stat().st_size / 1024 / 1024
    found: dict[str, dict[str, float]] = {}
    for n in (1, 2, 4):
        extra = ["--workers", str(n), "--shutdown-delay", "0", "--grpc-port", "-1"]
        with run_server(root / "models", root / f"server-{n}.log", extra, ready_timeout_s=300) as server:
            _workers_ready(f"http://127.0.0.1:{server.metrics_port}/metrics", n)
            time.sleep(1)
            pids = _family(server.process.pid)
            workers = pids[1:] if n > 1 else pids
            found[str(n)] = {
                "workers_pss_mb": round(sum(_pss_mb(p) for p in workers), 1),
                "supervisor_pss_mb": round(_pss_mb(pids[0]), 1) if n > 1 else 0.0,
            }
    one = found["1"]["workers_pss_mb"]
    for figures in found.values():
        figures["ratio_to_one_worker"] = round(
            (figures["workers_pss_mb"] + figures["supervisor_pss_mb"]) / one, 3
        )
    return {"weights_mb": round(weights, 1), "pss": found}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    scale = sub.add_parser("scaling")
    scale.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    scale.add_argument("--server-cpus", default="0")
    scale.add_argument("--client-cpus", default="1")
    scale.add_argument("--processes", type=int, default=1)
    scale.add_argument("--concurrency", type=int, default=32)
    scale.add_argument("--duration", type=float, default=10.0)
    scale.add_argument("--rounds", type=int, default=3)
    mem = sub.add_parser("memory")
    mem.add_argument("--model-mb", type=int, default=256)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    result: dict[str, object] = {"stamp": stamp(), "args": sys.argv[1:]}
    result |= scaling(args) if args.what == "scaling" else memory(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
