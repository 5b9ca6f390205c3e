"""gRPC beside HTTP JSON and HTTP binary, in one run, on both demo models at c = 1, 16, 64.

The server runs pinned to CPU 0 with one intra-op thread; all load runs pinned to CPU 1, from
native generators: HTTP with wrk (benchmarks/post.lua), gRPC with h2load (benchmarks/h2load.py:
one thread, a pre-serialized ModelInferRequest with raw_input_contents, ``c`` connections of
one stream each at concurrency ``c``, like wrk; ``--streams-per-connection`` multiplexes
instead). h2load checks only the HTTP status, so each gRPC cell's errors come from the server's
statistics extension read around the run, and one call per model is first decoded with
tritonclient. Each repeat runs the three transports back to back, so noise hits them alike;
cells are medians of ``--repeats`` runs. Writes a JSON stamped with machine, versions and git
revision under benchmarks/out/ and prints a Markdown table.

    python benchmarks/bench_grpc.py --seconds 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import body, in_process
from h2load import H2loadResult, grpc_frame, h2load_version, run_h2load
from machine import stamp as machine_stamp
from wrk import run_wrk

from ortserve.demo import DEMO_MODELS, write_demo_repository
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
WIDTHS = {"small_mlp": 64, "heavy_mlp": 512}
TRANSPORTS = ("http_json", "http_binary", "grpc")
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
LIVE_RESPONSE_BYTES = 5 + len(pb.ServerLiveResponse(live=True).SerializeToString())
WARM_UP_S = 0.5
R = TypeVar("R")


def grpc_request(model: str, width: int) -> bytes:
    """The framed ModelInferRequest h2load sends: the same input as the HTTP bodies."""
    data = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32)
    message = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, width])],
        raw_input_contents=[data.tobytes()],
    )
    return grpc_frame(message.SerializeToString())


def server_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    """The model's successful and failed requests so far, every version, from /stats."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=10) as reply:
        entries = json.load(reply)["model_stats"]
    stats = [entry["inference_stats"] for entry in entries]
    return sum(s["success"]["count"] for s in stats), sum(s["fail"]["count"] for s in stats)


def grpc_errors(result: H2loadResult, success: int, fail: int) -> int:
    """Failed calls of a run: HTTP-level failures plus calls answered with a gRPC error.

    The server's fail count, or if larger, the 200 responses it did not count as successes (a
    call refused before it reached a model version is in neither count). Calls h2load cut off
    at its stop may still succeed on the server, so successes may exceed the responses by that.
    """
    answered = result.completed - result.http_errors
    if success + fail > result.started:
        print(
            f"warning: server counted {success + fail} calls, h2load sent {result.started}", file=sys.stderr
        )
    return result.http_errors + max(fail, answered - success)


def run_grpc(
    server: ServerProcess, model: str, payload: bytes, concurrency: int, args: argparse.Namespace
) -> dict[str, float]:
    """One h2load run of ModelInfer, with the server's CPU and its own success/fail counts."""
    url = f"http://{server.grpc_address}{INFER}"
    success, fail = server_counts(server, model)
    result, cpu_s = with_cpu(
        server.process.pid,
        lambda: run_h2load(url, payload, concurrency, args.seconds, WARM_UP_S, args.streams_per_connection),
    )
    success_after, fail_after = server_counts(server, model)
    success, fail = success_after - success, fail_after - fail
    return {
        **result.as_dict(),
        "server_success": success,
        "server_fail": fail,
        "errors": grpc_errors(result, success, fail),
        **cpu_ms(cpu_s, result.completed),
    }


def run_live(server: ServerProcess, concurrency: int, args: argparse.Namespace) -> dict[str, float]:
    """Empty ServerLive calls; a call without the 7-byte ``live: true`` answer is an error."""
    url = f"http://{server.grpc_address}{LIVE}"
    streams = args.streams_per_connection if concurrency % args.streams_per_connection == 0 else 1
    result, cpu_s = with_cpu(
        server.process.pid,
        lambda: run_h2load(url, grpc_frame(b""), concurrency, args.seconds, WARM_UP_S, streams),
    )
    answered = result.completed - result.http_errors
    errors = result.http_errors + max(0, answered - result.data_bytes // LIVE_RESPONSE_BYTES)
    return {**result.as_dict(), "errors": errors, **cpu_ms(cpu_s, result.completed)}


def check_answers_agree(server: ServerProcess, model: str, width: int) -> None:
    """One decoded call per transport: the benchmark measures correct answers of the right shape."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    data = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32)
    answers = []
    for module, address in ((httpclient, server.http_address), (grpcclient, server.grpc_address)):
        tensor = module.InferInput("input", [1, width], "FP32")
        tensor.set_data_from_numpy(data)
        client = module.InferenceServerClient(address)
        try:
            answers.append(client.infer(model, [tensor]).as_numpy("output"))
            if module is grpcclient and not client.is_server_live():
                raise RuntimeError("gRPC ServerLive answered live: false")
        finally:
            client.close()
    expected = (1, DEMO_MODELS[model][0][-1])
    if answers[1] is None or answers[1].shape != expected:
        raise RuntimeError(f"{model} over gRPC: output {answers[1]!r}, expected shape {expected}")
    np.testing.assert_allclose(answers[0], answers[1], rtol=1e-6)


def measure(
    server: ServerProcess, model: str, concurrency: int, args: argparse.Namespace
) -> dict[str, object]:
    width = WIDTHS[model]
    path = f"/v2/models/{model}/infer"
    json_body, _ = body(width, binary=False)
    binary_body, header_length = body(width, binary=True)
    payload = grpc_request(model, width)
    pid, seconds = server.process.pid, args.seconds

    def wrk(data: bytes, header: int | None = None) -> dict[str, float]:
        result, cpu_s = with_cpu(
            pid, lambda: run_wrk(server.http_url, path, data, concurrency, seconds, header_length=header)
        )
        # wrk has no warm-up and runs whole seconds, so rate x seconds is the requests of the run.
        return {**result.as_dict(), **cpu_ms(cpu_s, result.requests_per_s * max(1, round(seconds)))}

    calls: dict[str, Callable[[], dict[str, float]]] = {
        "http_json": lambda: wrk(json_body),
        "http_binary": lambda: wrk(binary_body, header_length),
        "grpc": lambda: run_grpc(server, model, payload, concurrency, args),
    }
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in TRANSPORTS}
    for _ in range(args.repeats):
        for transport in TRANSPORTS:
            runs[transport].append(calls[transport]())
    cells = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in runs.items()}
    print(model, concurrency, json.dumps(cells), flush=True)
    return {"median": cells, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--streams-per-connection", type=int, default=1, help="gRPC streams per h2load connection"
    )
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = OUT / "models"
    if not (repo / "heavy_mlp").exists():
        write_demo_repository(repo)
    report: dict[str, object] = {
        **machine_stamp(),
        "grpcio": grpc.__version__,
        "h2load": h2load_version(),
        "grpc_load": f"h2load -t1, {args.streams_per_connection} stream(s)/connection, {WARM_UP_S} s warm-up",
        "intra_op_threads": 1,
        "server_cpu": 0,
        "load_cpu": 1,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "command": " ".join(["python", *sys.argv]),
    }
    cells: dict[str, object] = {}
    floor: dict[str, dict[str, float]] = {}
    server_args = ["--intra-op-threads", "1", "--metrics-port", "-1"]
    # ONNX Runtime alone on the server's core: what no transport can beat.
    report["in_process"] = {
        model: in_process(repo / model / "1" / "model.onnx", width, 2.0) for model, width in WIDTHS.items()
    }
    with run_server(repo, OUT / "server-grpc.log", server_args, pin_cpu=0) as server:
        for model, width in WIDTHS.items():
            check_answers_agree(server, model, width)
            run_h2load(f"http://{server.grpc_address}{INFER}", grpc_request(model, width), 16, 1.0)  # warm
            for concurrency in args.concurrency:
                cells[f"{model}/c{concurrency}"] = measure(server, model, concurrency, args)
        for concurrency in (1, 16):
            floor[f"c{concurrency}"] = run_live(server, concurrency, args)
    report["cells"] = cells
    report["grpc_server_live_floor"] = floor
    (OUT / f"grpc-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))
    print_table(report)


def server_cpu_s(pid: int) -> float:
    """CPU time (user + system, every thread) the server has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(pid: int, run: Callable[[], R]) -> tuple[R, float]:
    """``run()``, and the CPU seconds the server used meanwhile."""
    before = server_cpu_s(pid)
    result = run()
    return result, server_cpu_s(pid) - before


def cpu_ms(cpu_s: float, requests: float) -> dict[str, float]:
    """The server's CPU milliseconds per request of a run."""
    return {"server_cpu_ms": 1e3 * cpu_s / max(1.0, requests)}


def print_table(report: dict[str, object]) -> None:
    print(
        f"\n{report['date']} | {report['cpu']} | {report['cores']} cores | ORT {report['onnxruntime']} | "
        f"grpcio {report['grpcio']} | h2load {report['h2load']} | Python {report['python']} | "
        f"git {report['git']} | median of {report['repeats']} x {report['seconds']} s | "
        f"gRPC load: {report['grpc_load']}\n"
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

    # With the server's core saturated, req/s = 1 / (CPU per request), so a transport reaches
    # x JSON only if JSON's extra CPU per request is at least (x - 1) times the transport's own
    # CPU per request, which is at least ONNX Runtime's cost per row at the largest batch.
    print(
        "\n| model | ORT alone, batch 32: rows/s | ms/row | c=64 CPU ms/req: JSON - gRPC | JSON - binary"
        " | needed for 1.3x |"
    )
    print("|---|---|---|---|---|---|")
    for model, alone in report["in_process"].items():  # type: ignore[attr-defined]
        cell = report["cells"].get(f"{model}/c64")  # type: ignore[attr-defined]
        if cell is None:
            continue
        row_ms = 1e3 / alone["batch32_samples_per_s"]
        cpu = {transport: cell["median"][transport]["server_cpu_ms"] for transport in TRANSPORTS}
        print(
            f"| {model} | {alone['batch32_samples_per_s']:.0f} | {row_ms:.3f} | "
            f"{cpu['http_json'] - cpu['grpc']:.3f} | {cpu['http_json'] - cpu['http_binary']:.3f} | "
            f">= {0.3 * row_ms:.3f} |"
        )

    print("\n| gRPC ServerLive (empty call) c | req/s | p50 ms | server CPU ms/req | errors |")
    print("|---|---|---|---|---|")
    for key, m in report["grpc_server_live_floor"].items():  # type: ignore[attr-defined]
        print(
            f"| {key[1:]} | {m['requests_per_s']:.0f} | {m['p50_ms']:.3f} | {m['server_cpu_ms']:.3f} | "
            f"{m['errors']:.0f} |"
        )


if __name__ == "__main__":
    main()
