"""Overload: goodput, admitted and refused latency at 1x-8x the measured capacity (issue 10).

The server runs on CPU 0, the clients on CPU 1. For each model and transport the capacity is
measured first (closed loop, 64 requests in flight: requests/s and p99; by ``ortserve bench``
as before, and by the native generator, whose rate is the one the multiples use), then
open-loop constant-rate load at 1x, 2x, 4x and 8x that rate from the native generator
(benchmarks/openloop: uniform arrivals, one fixed request, latency from the intended send time
including any wait for a free connection inside the generator; 512 HTTP/1.1 connections, or 16
HTTP/2 connections x 32 streams for gRPC; 5 s client timeout; it needs gcc). Also: the same
models with ``latency_budget_ms``, 3,000 connections in a closed loop on small_mlp (2 s client
timeout; ``ortserve bench`` and the generator), and, with ``--baseline-src``, the c=64 closed
loop and the 4x point of an older checkout side by side.

    .venv/bin/python benchmarks/bench_overload.py --seconds 8
    .venv/bin/python benchmarks/bench_overload.py --baseline-src /tmp/base/src

Writes benchmarks/out/overload.json and, with matplotlib, benchmarks/out/overload.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import machine
from openloop.run import Summary, run_openloop

from ortserve.demo import write_demo_repository
from ortserve.loadtest.grpc_transport import encode_request
from ortserve.loadtest.inputs import encode_payload, fetch_input_specs, generated_inputs, infer_path
from ortserve.loadtest.transports import HttpTarget
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
MULTIPLES = (1, 2, 4, 8)
BUDGETS_MS = {"heavy_mlp": 100.0, "small_mlp": 20.0}
INFER = "/inference.GRPCInferenceService/ModelInfer"
OPEN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Wire:
    """One model's request as the generator sends it, and how many connections carry it."""

    target: str
    data: bytes
    grpc_path: str | None
    connections: int
    streams: int


def wire(server: ServerProcess, model: str, transport: str) -> Wire:
    http = HttpTarget(server.host, server.http_port)
    arrays = generated_inputs(fetch_input_specs(http, model, None), count=1)[0]
    if transport == "grpc":
        return Wire(server.grpc_address, encode_request(arrays, model, None), INFER, 16, 32)
    payload = encode_payload(arrays, infer_path(model, None), "json")
    return Wire(server.http_url, http.wire(payload), None, 512, 1)


def repository(root: Path) -> Path:
    """The demo MLPs, plus copies with a latency budget (the pipelines are left out: an
    older checkout given as baseline may not load today's)."""
    write_demo_repository(root)
    for folder in root.iterdir():
        if folder.name not in BUDGETS_MS:
            shutil.rmtree(folder)
    for name, budget in BUDGETS_MS.items():
        copy = root / f"{name}_budget"
        shutil.copytree(root / name, copy)
        config = (copy / "config.yaml").read_text()
        (copy / "config.yaml").write_text(config + f"  latency_budget_ms: {budget}\n")
    return root


def server_cpu_s(server: ServerProcess) -> float:
    """CPU seconds the server process has used (user + system, all threads)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(server: ServerProcess, model: str, transport: str, level: list[str], seconds: float) -> dict:
    """One ``ortserve bench`` level on CPU 1; returns its summary, with the server's CPU time
    per answer (warm-up included on both sides: answers scaled by (seconds + 1) / seconds)."""
    url = (
        f"{server.host}:{server.grpc_port}"
        if transport == "grpc"
        else f"http://{server.host}:{server.http_port}"
    )
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            "taskset", "-c", "1", sys.executable, "-m", "ortserve", "bench", url, "-m", model,
            "--transport", transport, "-d", str(seconds), "--warmup", "1", "-o", out.name,
            "--no-progress", *level,
        ]  # fmt: skip
        cpu_before = server_cpu_s(server)
        subprocess.run(command, check=True, capture_output=True)
        cpu = server_cpu_s(server) - cpu_before
        document = json.loads(Path(out.name).read_text())
    summary: dict = document["levels"][0]["summary"]
    answers = summary["requests"] * (seconds + 1) / seconds
    summary["server_cpu_us_per_answer"] = round(cpu / answers * 1e6, 1) if answers else None
    return summary


def figures(summary: dict) -> dict:
    """Goodput (2xx/s), admitted p50/p99, refusal p99, timeouts, generator lag."""
    statuses = summary["statuses"]
    ok = sum(count for name, count in statuses.items() if name.startswith("2") or name == "OK")
    refused = summary.get("refused_latency_ms", {})
    return {
        "goodput": round(ok / summary["elapsed_s"], 1) if summary["elapsed_s"] else 0.0,
        "offered": summary["achieved_rate"],
        "admitted_p50_ms": summary["latency_ms"]["p50"],
        "admitted_p99_ms": summary["latency_ms"]["p99"],
        "refused_p99_ms": refused.get("p99"),
        "statuses": statuses,
        "send_lag_p99_ms": summary.get("send_lag_p99_ms"),
        "generator_cores": summary["generator_cpu_cores"],
        "server_cpu_us_per_answer": summary["server_cpu_us_per_answer"],
    }


def open_figures(summary: Summary, server_cpu_s: float) -> dict:
    """The same figures as ``figures`` from a generator run, plus how requests ended."""
    ok, refused, lag = summary.ok_latency_ms, summary.refused_latency_ms, summary.send_lag_ms
    return {
        "goodput": summary.goodput,
        "offered": summary.achieved_rate,
        "admitted_p50_ms": ok.p50 if ok else None,
        "admitted_p99_ms": ok.p99 if ok else None,
        "refused_p99_ms": refused.p99 if refused else None,
        "statuses": summary.statuses,
        "timeouts": summary.timeouts,
        "errors": summary.errors,
        "expired_in_generator": summary.expired_in_queue,
        "connect_failures": summary.connect_failures,
        "send_lag_p99_ms": lag.p99 if lag else None,
        "generator_cores": round(summary.generator_cpu_s / (summary.window_seconds + 1), 2),
        "server_cpu_us_per_answer": (
            round(server_cpu_s / summary.completed * 1e6, 1) if summary.completed else None
        ),
    }


def sweep(
    server: ServerProcess,
    model: str,
    transport: str,
    capacity: float,
    seconds: float,
    multiples: tuple[int, ...],
) -> list[dict]:
    """Open-loop constant-rate levels at these multiples of ``capacity`` (generator on CPU 1)."""
    request = wire(server, model, transport)
    rows = []
    for multiple in multiples:
        rate = capacity * multiple
        cpu_before = server_cpu_s(server)
        summary = run_openloop(
            request.target, request.data, rate, seconds, request.connections, 1, OPEN_TIMEOUT_S,
            grpc_path=request.grpc_path, streams=request.streams, warmup_s=1.0,
        )  # fmt: skip
        row = open_figures(summary, server_cpu_s(server) - cpu_before)
        row |= {"multiple": multiple, "rate": round(rate)}
        print(f"  {model} {transport} {multiple}x ({rate:.0f}/s): {row}", flush=True)
        rows.append(row)
    return rows


def closed(server: ServerProcess, model: str, transport: str, concurrency: int, seconds: float) -> dict:
    """``ortserve bench`` closed loop (kept as the issue's original measure)."""
    level = ["-c", str(concurrency), "--timeout", "2"]
    row = figures(bench(server, model, transport, level, seconds))
    print(f"  {model} {transport} c={concurrency} (ortserve bench): {row}", flush=True)
    return row


def closed_native(
    server: ServerProcess, model: str, transport: str, concurrency: int, seconds: float
) -> dict:
    """The generator's closed loop: ``concurrency`` requests in flight (gRPC: over
    ``concurrency / 16`` connections), 2 s timeout; the client cannot be the limit."""
    request = wire(server, model, transport)
    streams = 16 if request.grpc_path else 1
    cpu_before = server_cpu_s(server)
    summary = run_openloop(
        request.target, request.data, 0, seconds, max(1, concurrency // streams), 1, 2.0,
        grpc_path=request.grpc_path, streams=streams, warmup_s=1.0,
    )  # fmt: skip
    row = open_figures(summary, server_cpu_s(server) - cpu_before)
    print(f"  {model} {transport} c={concurrency} (openloop): {row}", flush=True)
    return row


def measure(root: Path, logs: Path, seconds: float, env: dict[str, str] | None, full: bool) -> dict:
    """Everything against one server build (``env`` may point PYTHONPATH at another checkout).

    The open-loop multiples are of the generator's closed-loop c=64 rate (``capacity``);
    ``ortserve bench``'s c=64 figure is kept beside it as ``capacity_bench``."""
    results: dict = {}
    with run_server(root, logs / "server.log", ["--intra-op-threads", "1"], env=env, pin_cpu=0) as server:
        for model in ("heavy_mlp", "small_mlp"):
            for transport in ("http-json", "grpc") if full else ("http-json",):
                entry: dict = {"capacity_bench": closed(server, model, transport, 64, seconds)}
                capacity = entry["capacity"] = closed_native(server, model, transport, 64, seconds)
                multiples = MULTIPLES if full else (4,)
                entry["open_loop"] = sweep(server, model, transport, capacity["goodput"], seconds, multiples)
                if full and transport == "http-json":
                    entry["budget_ms"] = BUDGETS_MS[model]
                    entry["budget_open_loop"] = sweep(
                        server, f"{model}_budget", transport, capacity["goodput"], seconds, MULTIPLES
                    )
                results[f"{model}/{transport}"] = entry
        results["small_mlp/http-json/c3000"] = closed(server, "small_mlp", "http-json", 3000, seconds)
        results["small_mlp/http-json/c3000-openloop"] = closed_native(
            server, "small_mlp", "http-json", 3000, seconds
        )
    return results


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, entry in results["new"].items():
        if "open_loop" not in entry:
            continue
        capacity = entry["capacity"]["goodput"]
        for variant in ("open_loop", "budget_open_loop"):
            rows = entry.get(variant)
            if not rows:
                continue
            label = key + (" budget" if variant != "open_loop" else "")
            xs = [r["multiple"] for r in rows]
            left.plot(xs, [r["goodput"] / capacity for r in rows], marker="o", label=label)
            right.plot(xs, [r["admitted_p99_ms"] for r in rows], marker="o", label=label)
    left.axhline(0.9, color="grey", linestyle="--")
    left.set(xlabel="offered load (x capacity)", ylabel="goodput / capacity", xscale="log", ylim=(0, 1.2))
    right.set(xlabel="offered load (x capacity)", ylabel="admitted p99 (ms)", xscale="log", yscale="log")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--baseline-src", type=Path, help="src/ of an older checkout to compare")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    results: dict = {"stamp": machine.stamp(), "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        root = repository(Path(tmp) / "models")
        if args.baseline_src is not None:
            print("baseline:", args.baseline_src, flush=True)
            env = {"PYTHONPATH": str(args.baseline_src), "PYTHONDONTWRITEBYTECODE": "1"}
            results["baseline"] = measure(root, Path(tmp), args.seconds, env, full=False)
        print("this checkout:", flush=True)
        results["new"] = measure(root, Path(tmp), args.seconds, None, full=True)
    (OUT / "overload.json").write_text(json.dumps(results, indent=2))
    plot(results, OUT / "overload.png")
    print("wrote", OUT / "overload.json", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
