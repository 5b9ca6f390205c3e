"""gRPC beside HTTP JSON and HTTP binary, in one run, on both demo models at c = 1, 16, 64.

The server runs pinned to CPU 0 with one intra-op thread; all load runs pinned to CPU 1:
HTTP with wrk (benchmarks/post.lua), gRPC with this script's own grpc.aio load generator
(``--worker`` mode: pre-serialized ModelInferRequest with raw_input_contents, one channel per
process, responses left undecoded as wrk leaves bodies unparsed, every status checked), in 1
process at c=1 and 2 processes above. Each repeat runs the three transports back to back, so
noise hits them alike; cells are medians of ``--repeats`` runs. Writes a JSON stamped with
machine, versions and git revision under benchmarks/out/ and prints a Markdown table.

    python benchmarks/bench_grpc.py --seconds 4 --repeats 3
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
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import body
from machine import stamp as machine_stamp
from wrk import run_wrk

from ortserve.demo import write_demo_repository
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
WIDTHS = {"small_mlp": 64, "heavy_mlp": 512}
TRANSPORTS = ("http_json", "http_binary", "grpc")
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def grpc_request(model: str, width: int) -> bytes:
    data = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32)
    message = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, width])],
        raw_input_contents=[data.tobytes()],
    )
    return message.SerializeToString()


async def _load(
    address: str, method: str, payload: bytes, concurrency: int, seconds: float
) -> dict[str, object]:
    """``concurrency`` callers in a closed loop on one channel; latencies of the timed part."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(method)  # bytes in, bytes out: no (de)serialization cost
        latencies: list[float] = []
        errors = 0
        warm_until = time.perf_counter() + 0.5
        stop_at = warm_until + seconds

        async def caller() -> None:
            nonlocal errors
            while (start := time.perf_counter()) < stop_at:
                try:
                    await call(payload, timeout=10)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                if start >= warm_until:
                    latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return {"latencies": latencies, "errors": errors}


def worker(args: argparse.Namespace) -> None:
    payload = Path(args.payload).read_bytes()
    try:
        import uvloop

        result = uvloop.run(_load(args.address, args.method, payload, args.concurrency[0], args.seconds))
    except ImportError:
        result = asyncio.run(_load(args.address, args.method, payload, args.concurrency[0], args.seconds))
    json.dump(result, sys.stdout)


def run_grpc(
    address: str, payload_path: Path, concurrency: int, seconds: float, method: str = INFER
) -> dict[str, float]:
    """The load generator in 1 (c=1) or 2 worker processes on CPU 1, merged."""
    processes = 1 if concurrency == 1 else 2
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    command = [
        "taskset",
        "-c",
        "1",
        sys.executable,
        __file__,
        "--worker",
        "--address",
        address,
        "--payload",
        str(payload_path),
        "--seconds",
        str(seconds),
        "--method",
        method,
    ]
    children = [
        subprocess.Popen([*command, "--concurrency", str(share)], stdout=subprocess.PIPE, text=True)
        for share in shares
    ]
    results = [json.loads(child.communicate()[0]) for child in children]
    latencies = sorted(x for r in results for x in r["latencies"])

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3

    return {
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "errors": float(sum(r["errors"] for r in results)),
    }


def check_answers_agree(server: ServerProcess, model: str, width: int) -> None:
    """One decoded call per transport: the benchmark measures correct answers."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    data = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32)
    answers = []
    for module, address in ((httpclient, server.http_address), (grpcclient, server.grpc_address)):
        tensor = module.InferInput("input", [1, width], "FP32")
        tensor.set_data_from_numpy(data)
        answers.append(module.InferenceServerClient(address).infer(model, [tensor]).as_numpy("output"))
    np.testing.assert_allclose(answers[0], answers[1], rtol=1e-6)


def measure(
    server: ServerProcess, model: str, concurrency: int, args: argparse.Namespace
) -> dict[str, object]:
    width = WIDTHS[model]
    path = f"/v2/models/{model}/infer"
    json_body, _ = body(width, binary=False)
    binary_body, header_length = body(width, binary=True)
    payload_path = OUT / f"grpc-{model}.bin"
    payload_path.write_bytes(grpc_request(model, width))
    pid, seconds = server.process.pid, args.seconds
    calls: dict[str, Callable[[], dict[str, float]]] = {
        "http_json": lambda: run_wrk(server.http_url, path, json_body, concurrency, seconds).as_dict(),
        "http_binary": lambda: run_wrk(
            server.http_url, path, binary_body, concurrency, seconds, header_length=header_length
        ).as_dict(),
        "grpc": lambda: run_grpc(server.grpc_address, payload_path, concurrency, seconds),
    }
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in TRANSPORTS}
    for _ in range(args.repeats):
        for transport in TRANSPORTS:
            runs[transport].append(with_cpu(pid, seconds, calls[transport]))
    cells = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in runs.items()}
    print(model, concurrency, json.dumps(cells), flush=True)
    return {"median": cells, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--payload", help=argparse.SUPPRESS)
    parser.add_argument("--method", default=INFER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    OUT.mkdir(exist_ok=True)
    repo = OUT / "models"
    if not (repo / "heavy_mlp").exists():
        write_demo_repository(repo)
    report: dict[str, object] = {
        **machine_stamp(),
        "grpcio": grpc.__version__,
        "intra_op_threads": 1,
        "server_cpu": 0,
        "load_cpu": 1,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "command": " ".join(["python", *sys.argv]),
        "cells": {},
    }
    cells: dict[str, object] = {}
    floor: dict[str, dict[str, float]] = {}
    server_args = ["--intra-op-threads", "1", "--metrics-port", "-1"]
    with run_server(repo, OUT / "server-grpc.log", server_args) as server:
        pin_all_threads(server.process.pid, cpu=0)
        for model, width in WIDTHS.items():
            check_answers_agree(server, model, width)
            run_grpc(server.grpc_address, _warm_payload(model, width), 16, 1.0)
            for concurrency in args.concurrency:
                cells[f"{model}/c{concurrency}"] = measure(server, model, concurrency, args)
        empty = OUT / "grpc-empty.bin"
        empty.write_bytes(b"")
        for concurrency in (1, 16):
            floor[f"c{concurrency}"] = with_cpu(
                server.process.pid,
                args.seconds,
                lambda c=concurrency: run_grpc(server.grpc_address, empty, c, args.seconds, LIVE),
            )
    report["cells"] = cells
    report["grpc_server_live_floor"] = floor
    (OUT / f"grpc-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))
    print_table(report)


def server_cpu_s(pid: int) -> float:
    """CPU time (user + system, every thread) the server has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(pid: int, seconds: float, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """One measurement, plus the server's CPU milliseconds per request during it.

    The CPU time includes the load generator's short warm-up, so it slightly overstates.
    """
    before = server_cpu_s(pid)
    result = run()
    used = server_cpu_s(pid) - before
    return {**result, "server_cpu_ms": 1e3 * used / max(1.0, result["requests_per_s"] * seconds)}


def pin_all_threads(pid: int, cpu: int) -> None:
    """Pin every thread of the server (ONNX Runtime's, gRPC's) to one CPU, like taskset at launch."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, capture_output=True)


def _warm_payload(model: str, width: int) -> Path:
    path = OUT / f"grpc-{model}.bin"
    path.write_bytes(grpc_request(model, width))
    return path


def print_table(report: dict[str, object]) -> None:
    print(
        f"\n{report['date']} | {report['cpu']} | {report['cores']} cores | ORT {report['onnxruntime']} | "
        f"grpcio {report['grpcio']} | Python {report['python']} | git {report['git']} | "
        f"median of {report['repeats']} x {report['seconds']} s\n"
    )
    print(
        "| model | c | transport | req/s | x JSON | p50 ms | p90 ms | p99 ms | server CPU ms/req | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, cell in report["cells"].items():  # type: ignore[attr-defined]
        model, concurrency = key.split("/c")
        medians = cell["median"]
        base = medians["http_json"]["requests_per_s"]
        for transport in TRANSPORTS:
            m = medians[transport]
            print(
                f"| {model} | {concurrency} | {transport} | {m['requests_per_s']:.0f} | "
                f"{m['requests_per_s'] / base:.2f} | {m['p50_ms']:.3f} | {m['p90_ms']:.3f} | "
                f"{m['p99_ms']:.3f} | {m['server_cpu_ms']:.3f} | {m['errors']:.0f} |"
            )

    print("\n| gRPC ServerLive (empty call) c | req/s | p50 ms | server CPU ms/req |")
    print("|---|---|---|---|")
    for key, m in report["grpc_server_live_floor"].items():  # type: ignore[attr-defined]
        print(f"| {key[1:]} | {m['requests_per_s']:.0f} | {m['p50_ms']:.3f} | {m['server_cpu_ms']:.3f} |")


if __name__ == "__main__":
    main()
