"""Core benchmark: in-process ONNX Runtime beside the server, both demo models, c = 1, 16, 64.

Server pinned to CPU 0 with one intra-op thread; wrk pinned to CPU 1. Each cell is the median
of ``--repeats`` runs. Writes a JSON stamped with machine, versions and git revision, and
prints a Markdown table for benchmarks/RESULTS.md.

    python benchmarks/bench_core.py --seconds 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp
from wrk import WrkResult, run_wrk

from ortserve.demo import DEMO_MODELS, write_demo_repository
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"


def in_process(model_path: Path, width: int, seconds: float) -> dict[str, float]:
    """ONNX Runtime alone on CPU 0, one thread: batch-1 latency and batch-32 samples/s."""
    os.sched_setaffinity(0, {0})
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    result: dict[str, float] = {}
    for batch in (1, 32):
        feeds = {"input": rng.standard_normal((batch, width)).astype(np.float32)}
        for _ in range(20):
            session.run(None, feeds)
        times = []
        deadline = time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - start)
        result[f"batch{batch}_p50_ms"] = statistics.median(times) * 1e3
        result[f"batch{batch}_samples_per_s"] = batch / statistics.median(times)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return result


def body(width: int, binary: bool) -> tuple[bytes, int | None]:
    data = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32)
    if not binary:
        document = {
            "inputs": [
                {"name": "input", "shape": [1, width], "datatype": "FP32", "data": data.ravel().tolist()}
            ]
        }
        return json.dumps(document).encode(), None
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, width],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + data.tobytes(), len(header)


def median_result(results: list[WrkResult]) -> dict[str, float]:
    keys = results[0].as_dict().keys()
    return {k: statistics.median(r.as_dict()[k] for r in results) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--binary", action="store_true", help="binary tensor data instead of JSON")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = OUT / "models"
    if not (repo / "heavy_mlp").exists():
        write_demo_repository(repo)
    widths = {
        name: sizes[0] for name, (sizes, _) in DEMO_MODELS.items() if name in ("small_mlp", "heavy_mlp")
    }
    report: dict[str, object] = {
        **machine_stamp(),
        "intra_op_threads": 1,
        "server_cpu": 0,
        "load_cpu": 1,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "payload": "binary" if args.binary else "json",
        "in_process": {},
        "server": {},
    }
    for name, width in widths.items():
        report["in_process"][name] = in_process(repo / name / "1" / "model.onnx", width, args.seconds)  # type: ignore[index]
    log = OUT / "server.log"
    server_args = ["--intra-op-threads", "1", "--grpc-port", "-1", "--metrics-port", "-1"]
    with run_server(repo, log, server_args, pin_cpu=0) as server:
        for name, width in widths.items():
            payload, header_length = body(width, args.binary)
            path = f"/v2/models/{name}/infer"
            run_wrk(server.http_url, path, payload, 16, 2, header_length=header_length)  # warm
            for concurrency in args.concurrency:
                runs = [
                    run_wrk(
                        server.http_url, path, payload, concurrency, args.seconds, header_length=header_length
                    )
                    for _ in range(args.repeats)
                ]
                report["server"][f"{name}/c{concurrency}"] = median_result(runs)  # type: ignore[index]
                print(name, concurrency, report["server"][f"{name}/c{concurrency}"], flush=True)  # type: ignore[index]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (OUT / f"core-{stamp}.json").write_text(json.dumps(report, indent=2))
    print_table(report)


def print_table(report: dict[str, object]) -> None:
    print(
        f"\n{report['date']} | {report['cpu']} | ORT {report['onnxruntime']} | git {report['git']} | "
        f"payload {report['payload']} | median of {report['repeats']} x {report['seconds']} s\n"
    )
    print("| model | concurrency | req/s | p50 ms | p90 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for key, cell in report["server"].items():  # type: ignore[attr-defined]
        name, conc = key.split("/c")
        print(
            f"| {name} | {conc} | {cell['requests_per_s']:.0f} | {cell['p50_ms']:.2f} | {cell['p90_ms']:.2f} | "
            f"{cell['p99_ms']:.2f} | {cell['errors']:.0f} |"
        )
    print("\n| model | in-process batch 1 p50 ms | batch 1 samples/s | batch 32 samples/s |")
    print("|---|---|---|---|")
    for name, cell in report["in_process"].items():  # type: ignore[attr-defined]
        print(
            f"| {name} | {cell['batch1_p50_ms']:.3f} | {cell['batch1_samples_per_s']:.0f} | "
            f"{cell['batch32_samples_per_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
