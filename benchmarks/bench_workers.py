"""Worker processes (``--workers N``): throughput, server CPU per request, and memory (PSS).

Two measurements, each with every server started here, side by side in one run:

* ``scaling``: small_mlp (JSON over HTTP, closed loop) against ``--workers N`` for each N in
  ``--workers``, alternating each round, the server started under ``taskset`` on
  ``--server-cpus`` (so it sizes its thread budget to them) and the load generator (``ortserve
  bench``, its own processes) on ``--client-cpus``. Reports req/s, the server's CPU time (utime
  + stime from /proc/<pid>/stat, summed over the supervisor, every worker and the zygote, for as
  long as it lives: it exits once the workers are forked) per
  request it answered (its statistics, merged over the workers), requests per execution (the
  mean batch) and context switches per request. ``--per-worker-baseline`` adds, in the same
  rounds, one worker at the connections each of N workers gets: what a smaller batch alone costs.
* ``memory``: a model of ``--model-mb`` MB whose weights are external data with
  ``prepack_weights: false`` (memory-mapped, shared), served by 1, 2 and 4 workers; the PSS
  (``/proc/<pid>/smaps_rollup``) of every server process, by role (supervisor, zygote if one
  is left, worker), once each worker has run the model. One worker is one process (no
  supervisor): the 1-worker total is that process alone, the N-worker totals include the
  supervisor.

On this 2-core machine:   python benchmarks/bench_workers.py scaling --workers 1,2 --server-cpus 0 --client-cpus 1
                          python benchmarks/bench_workers.py memory --model-mb 256 [--restart]
On a 16-core machine:     python benchmarks/bench_workers.py scaling --workers 1,2,4,8 \\
                              --server-cpus 0-7 --client-cpus 8-15 --processes 8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from ortserve.testing import ServerProcess, run_server

_TICK = os.sysconf("SC_CLK_TCK")


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (the supervisor and its workers)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            found.extend(_family(int(child)))
    return found


def _switches(pids: list[int]) -> int:
    """Context switches (voluntary and not) of every thread of ``pids``."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


_ROLLUP = ("Pss", "Pss_Anon", "Pss_File", "Private_Dirty", "Private_Clean", "Shared_Clean", "Shared_Dirty")


def _rollup_mb(pid: int) -> dict[str, float]:
    """``/proc/<pid>/smaps_rollup`` in MB: PSS (anonymous and file-backed) and what is private."""
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in _ROLLUP:
            found[name] = round(int(rest.split()[0]) / 1024, 1)
    if "Pss" not in found:
        raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")
    return found


def _role(pid: int, root: int) -> str:
    """The supervisor is the root; its child with children the zygote; the others workers."""
    if pid == root:
        return "supervisor"
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    forks = any((task / "children").read_text().split() for task in Path(f"/proc/{pid}/task").iterdir())
    return "zygote" if parent == root and forks else "worker"


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
        for label, n, concurrency in _configurations(args):
            extra = ["--workers", str(n), "--shutdown-delay", "0"]
            # Pinned from the start, so the supervisor sizes the thread budget to these CPUs.
            log = root / f"server-{n}.log"
            with run_server(root / "models", log, extra, pin_cpu=args.server_cpus) as server:
                _workers_ready(f"http://127.0.0.1:{server.metrics_port}/metrics", n)
                pids = _family(server.process.pid)
                out = root / f"bench-{label}.json"
                command = [
                    "taskset", "-c", args.client_cpus,
                    sys.executable, "-m", "ortserve", "bench", server.http_url, "-m", "small_mlp",
                    "-c", str(concurrency), "-d", str(args.duration), "--warmup", "2",
                    "-p", str(args.processes), "-o", str(out), "--no-progress",
                ]  # fmt: skip
                counts = _counts(server.http_url)
                before, switched = _cpu_seconds(pids), _switches(pids)
                subprocess.run(command, check=True, capture_output=True)
                cpu, switched = _cpu_seconds(pids) - before, _switches(pids) - switched
                inferences, executions = (b - a for a, b in zip(counts, _counts(server.http_url)))
                level = json.loads(out.read_text())["levels"][0]["summary"]
                results.setdefault(label, []).append(
                    {
                        "req_per_s": level["achieved_rate"],
                        "p50_ms": level["latency_ms"]["p50"],
                        "p99_ms": level["latency_ms"]["p99"],
                        # Every server process, over warm-up and measurement, per request the
                        # server answered in that time (its statistics, all workers merged).
                        "server_cpu_ms_per_request": 1000 * cpu / max(inferences, 1),
                        "requests_per_execution": inferences / max(executions, 1),
                        "server_cpu_ms_per_execution": 1000 * cpu / max(executions, 1),
                        "context_switches_per_request": switched / max(inferences, 1),
                        "errors": level["errors"],
                        "statuses": level["statuses"],
                    }
                )
    medians = {
        n: {k: statistics.median(float(r[k]) for r in runs) for k in runs[0] if k != "statuses"}  # type: ignore[arg-type]
        for n, runs in results.items()
    }
    return {"runs": results, "medians": medians}


def _configurations(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(label, workers, connections) per server of a round; with ``--per-worker-baseline``, also
    one worker at the connections each of N workers gets (what a smaller batch alone costs)."""
    found = [(str(n), n, args.concurrency) for n in args.workers]
    if args.per_worker_baseline:
        found += [(f"1@c{args.concurrency // n}", 1, args.concurrency // n) for n in args.workers if n > 1]
    return found


def _counts(url: str) -> tuple[int, int]:
    """small_mlp's inference and execution (batch) counts, summed over the workers."""
    with urllib.request.urlopen(f"{url}/v2/models/small_mlp/stats", timeout=30) as reply:
        stats = json.loads(reply.read())["model_stats"]
    return sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats)


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
    """Total PSS of every server process (supervisor, zygote, workers) for 1, 2 and 4 workers."""
    root = Path(tempfile.mkdtemp(prefix="bench-workers-pss-"))
    _big_model(root / "models", args.model_mb)
    weights = (root / "models" / "big" / "1" / "weights.bin").stat().st_size / 1024 / 1024
    found: dict[str, dict[str, object]] = {}
    for n in args.workers:
        extra = ["--workers", str(n), "--shutdown-delay", "0", "--grpc-port", "-1"]
        with run_server(root / "models", root / f"server-{n}.log", extra, ready_timeout_s=300) as server:
            _workers_ready(f"http://127.0.0.1:{server.metrics_port}/metrics", n)
            _infer_big(server.http_url, n)  # every worker has run the model once
            time.sleep(1)
            found[str(n)] = _pss(server.process.pid, n)
            if args.restart and n > 1:  # one worker killed, restarted (from a fresh zygote), run
                _restart_one(server, n)
                _infer_big(server.http_url, n)
                time.sleep(1)
                found[f"{n} after a restart"] = _pss(server.process.pid, n)
    one = float(found[str(args.workers[0])]["total_pss_mb"])  # type: ignore[arg-type]
    for figures in found.values():
        figures["ratio_to_first"] = round(float(figures["total_pss_mb"]) / one, 3)  # type: ignore[arg-type]
    return {"weights_mb": round(weights, 1), "pss": found}


def _pss(root: int, n: int) -> dict[str, object]:
    """PSS of ``root`` and its descendants, by role, and their total."""
    pids = _family(root)
    processes = [
        {"pid": pid, "role": _role(pid, root) if n > 1 else "worker", **_rollup_mb(pid)} for pid in pids
    ]
    by_role: dict[str, float] = {}
    for process in processes:
        role = str(process["role"])
        by_role[role] = round(by_role.get(role, 0.0) + float(process["Pss"]), 1)  # type: ignore[arg-type]
    return {
        "total_pss_mb": round(sum(float(p["Pss"]) for p in processes), 1),  # type: ignore[arg-type]
        "pss_by_role_mb": by_role,
        "processes": processes,
    }


def _restart_one(server: ServerProcess, n: int, timeout_s: float = 300) -> None:
    """SIGKILL one worker; return once its successor is ready and no zygote is left."""
    root = server.process.pid
    killed = max(pid for pid in _family(root) if pid != root)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:  # a process may vanish while the tree is read
            pids = _family(root)
            if killed in pids or len(pids) != n + 1 or "zygote" in {_role(pid, root) for pid in pids}:
                continue
        except OSError:
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as reply:
            if f"ortserve_workers_ready {float(n)}" in reply.read().decode():
                return
    raise TimeoutError("the killed worker was not replaced")


def _infer_big(url: str, workers: int) -> None:
    """A few requests on fresh connections, so each worker has most likely run the model."""
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4096], "datatype": "FP32", "data": [0.5] * 4096}]}
    ).encode()
    for _ in range(4 * workers):
        call = urllib.request.Request(f"{url}/v2/models/big/infer", body, {"Connection": "close"})
        with urllib.request.urlopen(call, timeout=60) as reply:
            reply.read()


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
    scale.add_argument("--per-worker-baseline", action="store_true")
    mem = sub.add_parser("memory")
    mem.add_argument("--model-mb", type=int, default=256)
    mem.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    mem.add_argument("--restart", action="store_true", help="also after killing one worker (restarted)")
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
