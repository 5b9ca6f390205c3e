"""Resilience figures: level switch times over injected incidents, and the hot-path overhead.

``switch``: one server (CPU 0) serves small_mlp with a CPU fallback session; an injected fault
takes level 0 down for 1.1 s of every 3 s (20 incidents). Four closed-loop HTTP clients (CPU 1)
record every request's send and receive times, status and answering level. The fault
schedule's origin is read from the server log (``schedule from monotonic T``; both processes
read the same CLOCK_MONOTONIC), so each incident's onset and end are known exactly. Per
incident: the time from onset until every request sent after it is answered by the next level,
the time from the fault's end until every request is answered by level 0 again, and the
requests that failed in between.

``overhead``: small_mlp three times in one server: plain, plain2 (the A/A control, identical
to plain) and guarded (a fallback chain with its breaker, and an input sandbox on the input),
measured in rotating order with h2load over gRPC: c=1 p50 latency, c=64 requests/s, server CPU
per call and rows per batch (from the statistics extension); the median over rounds of each
round's ratio to plain. The A/A ratio says how far two identical models differ in this run.

``interleaved``: c=1 latency of the same three models with their calls interleaved one by
one (plain, plain2, guarded, plain, ...) from one gRPC client (grpcio, CPU 1): every arm sees
the same moments of the machine, so the slow drift of a shared VM, which moves whole h2load
windows by +-10%, cancels. Per arm the p50 over all calls, and the median over blocks of each
block's p50 ratio to plain (A/A: plain2).

``micro``: microseconds per call of each piece the guard adds (chain, sandbox, checks).

Usage: ``python benchmarks/bench_resilience.py [switch|overhead|interleaved|micro|both] [--rounds 5]``
Writes benchmarks/out/resilience.json (each measurement under its own key; a later run of one
measurement replaces that key and keeps the others).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpc import server_cpu_s
from h2load import grpc_frame, h2load_version, run_h2load
from machine import stamp as machine_stamp

from ortserve.core.marks import unmark
from ortserve.core.sandbox import InputLimits, InputSandbox
from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.resilience.breaker import Breaker, BreakerPolicy
from ortserve.resilience.chain import FallbackChain
from ortserve.resilience.levels import SessionLevel
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
INFER = "/inference.GRPCInferenceService/ModelInfer"
CYCLE_S, ACTIVE_S, OFFSET_S, INCIDENTS = 3.0, 1.1, 2.0, 20
SWITCH_CONFIG = f"""batching: {{max_batch_size: 32}}
fallback: {{session: cpu, build: load, breaker: {{consecutive_failures: 3, open_s: 0.2, max_open_s: 0.4}}}}
faults: {{L0: {{error_rate: 1.0, cycle_s: {CYCLE_S}, active_s: {ACTIVE_S}, offset_s: {OFFSET_S}}}}}
"""
GUARDED_CONFIG = """batching: {max_batch_size: 32}
fallback: {session: cpu}
inputs: {input: {min: -100, max: 100, allow_nan: false, allow_inf: false}}
"""
PLAIN_CONFIG = "batching: {max_batch_size: 32}\n"


def write_model(root: Path, name: str, config: str) -> None:
    sizes, seed = DEMO_MODELS["small_mlp"]
    folder = root / name / "1"
    folder.mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, name), str(folder / "model.onnx"))
    (root / name / "config.yaml").write_text(config, encoding="utf-8")


@dataclass(slots=True)
class Call:
    sent: float
    received: float
    status: int
    level: int


def closed_loop(
    server: ServerProcess, model: str, until: float, calls: list[Call], lock: threading.Lock
) -> None:
    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
    ).encode()
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    while (sent := time.monotonic()) < until:
        try:
            connection.request("POST", f"/v2/models/{model}/infer", body)
            reply = connection.getresponse()
            payload = reply.read()
            status = reply.status
        except (OSError, http.client.HTTPException):
            connection.close()
            connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
            status, payload = 0, b"{}"
        level = (
            int(json.loads(payload).get("parameters", {}).get("fallback_level", 0)) if status == 200 else -1
        )
        with lock:
            calls.append(Call(sent, time.monotonic(), status, level))
    connection.close()


def incident(calls: list[Call], onset: float, end: float, next_onset: float) -> dict[str, float]:
    """Switch times of one incident (see the module docstring)."""

    def settled(start: float, stop: float, old: set[int]) -> float:
        # Requests sent and answered inside the phase (an answer after ``stop`` belongs to the
        # next phase: the next incident, or the recovery).
        inside = [c for c in calls if start <= c.sent and c.received < stop and c.status == 200]
        stale = [c.received for c in inside if c.level in old]
        if stale:
            return max(stale) - start
        fresh = [c.received for c in inside]
        return (min(fresh) - start) if fresh else float("nan")

    to_next = settled(onset, end, {0})
    back = settled(end, next_onset, {1, 2, 3})
    failed = sum(1 for c in calls if onset <= c.sent < end + back + 0.5 and c.status != 200)
    return {"to_next_s": to_next, "back_s": back, "failed": failed}


def switch(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="ortserve-drill-") as tmp:
        root = Path(tmp)
        write_model(root / "models", "drill", SWITCH_CONFIG)
        os.sched_setaffinity(0, {1})
        extra = ["--enable-fault-injection", "--intra-op-threads", "1", "--grpc-port", "-1"]
        with run_server(root / "models", root / "server.log", extra, pin_cpu=0) as server:
            found = re.search(r"schedule from monotonic ([0-9.]+)", server.log())
            assert found, "no fault schedule in the server log"
            origin = float(found.group(1)) + OFFSET_S
            until = origin + INCIDENTS * CYCLE_S + 0.5
            calls: list[Call] = []
            lock = threading.Lock()
            threads = [
                threading.Thread(target=closed_loop, args=(server, "drill", until, calls, lock))
                for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    rows = [
        incident(calls, origin + k * CYCLE_S, origin + k * CYCLE_S + ACTIVE_S, origin + (k + 1) * CYCLE_S)
        for k in range(INCIDENTS)
    ]
    to_next = [r["to_next_s"] for r in rows]
    back = [r["back_s"] for r in rows]
    return {
        "incidents": rows,
        "to_next_ms": {
            "p50": round(statistics.median(to_next) * 1e3, 2),
            "max": round(max(to_next) * 1e3, 2),
        },
        "back_ms": {"p50": round(statistics.median(back) * 1e3, 2), "max": round(max(back) * 1e3, 2)},
        "failed_requests": sum(int(r["failed"]) for r in rows),
        "requests": len(calls),
        "config": SWITCH_CONFIG,
    }


def grpc_body(model: str) -> bytes:
    data = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    message = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 64])],
        raw_input_contents=[data.tobytes()],
    )
    return grpc_frame(message.SerializeToString())


ARM_CONFIGS = {"plain": PLAIN_CONFIG, "plain2": PLAIN_CONFIG, "guarded": GUARDED_CONFIG}
"""Each arm's config; ``plain2`` is the A/A control: a second plain model in the same server,
measured alike."""
ARMS = tuple(ARM_CONFIGS)


def rotated(index: int) -> tuple[str, ...]:
    """The arms in round ``index``'s order: rotated each round, so no arm always follows the
    same one."""
    shift = index % len(ARMS)
    return ARMS[shift:] + ARMS[:shift]


def write_arms(models: Path) -> None:
    """small_mlp as each arm of :data:`ARM_CONFIGS`, in the repository ``models``."""
    for name, config in ARM_CONFIGS.items():
        write_model(models, name, config)


@contextmanager
def arms_server(label: str) -> Iterator[ServerProcess]:
    """One server (CPU 0, one intra-op thread) serving every arm, in a temporary repository."""
    with tempfile.TemporaryDirectory(prefix=f"ortserve-{label}-") as tmp:
        root = Path(tmp)
        write_arms(root / "models")
        with run_server(
            root / "models", root / "server.log", ["--intra-op-threads", "1"], pin_cpu=0
        ) as server:
            yield server


def stats_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    """The model's (inference_count, execution_count) so far, from the statistics extension."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=10) as reply:
        found = json.loads(reply.read())["model_stats"][0]
    return int(found["inference_count"]), int(found["execution_count"])


def overhead(args: argparse.Namespace) -> dict[str, object]:
    keys = ("c1_p50_ms", "c64_rps", "c64_cpu_ms_per_call", "c64_rows_per_batch")
    figures: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in ARMS}
    with arms_server("overhead") as server:
        url = f"http://{server.grpc_address}{INFER}"
        for model in ARMS:
            run_h2load(url, grpc_body(model), 16, 1.0)  # warm
        for index in range(args.rounds):
            for model in rotated(index):
                one = run_h2load(url, grpc_body(model), 1, args.seconds)
                before = server_cpu_s(server.process.pid)
                counts = stats_counts(server, model)
                many = run_h2load(url, grpc_body(model), 64, args.seconds)
                cpu_s = server_cpu_s(server.process.pid) - before
                after = stats_counts(server, model)
                figures[model]["c1_p50_ms"].append(one.p50_ms)
                figures[model]["c64_rps"].append(many.requests_per_s)
                figures[model]["c64_cpu_ms_per_call"].append(1e3 * cpu_s / max(1, many.completed))
                figures[model]["c64_rows_per_batch"].append(
                    (after[0] - counts[0]) / max(1, after[1] - counts[1])
                )
    medians = {m: {k: statistics.median(v) for k, v in f.items()} for m, f in figures.items()}

    def paired(arm: str) -> dict[str, float]:
        """The median over rounds of each round's arm / plain ratio."""
        return {
            k: round(
                statistics.median(a / b for a, b in zip(figures[arm][k], figures["plain"][k], strict=True)), 3
            )
            for k in keys
        }

    return {
        "rounds": figures,
        "medians": medians,
        "guarded_over_plain_paired_median": paired("guarded"),
        "aa_plain2_over_plain_paired_median": paired("plain2"),
        "h2load": h2load_version(),
    }


def interleaved(args: argparse.Namespace) -> dict[str, object]:
    """c=1 latency per arm, calls interleaved across the arms (see the module docstring)."""
    import grpc  # the test extra's client; only this measurement needs it

    blocks, per_block = args.rounds, args.calls_per_block
    latencies: dict[str, list[list[float]]] = {m: [] for m in ARMS}
    with arms_server("interleaved") as server:
        os.sched_setaffinity(0, {1})
        with grpc.insecure_channel(server.grpc_address) as channel:
            call = channel.unary_unary(INFER)  # bytes in, bytes out: no protobuf work per call
            bodies = {m: grpc_body(m)[5:] for m in ARMS}  # the message without gRPC's framing
            for _ in range(300):
                for model in ARMS:
                    call(bodies[model], timeout=10)
            clock = time.perf_counter
            for block in range(blocks):
                found: dict[str, list[float]] = {m: [] for m in ARMS}
                for _ in range(per_block):
                    for model in rotated(block):
                        started = clock()
                        call(bodies[model], timeout=10)
                        found[model].append(clock() - started)
                for model in ARMS:
                    latencies[model].append(found[model])

    def p50_ms(values: list[float]) -> float:
        return 1e3 * statistics.median(values)

    def block_ratio(arm: str) -> float:
        return round(
            statistics.median(
                p50_ms(a) / p50_ms(b) for a, b in zip(latencies[arm], latencies["plain"], strict=True)
            ),
            4,
        )

    return {
        "blocks": blocks,
        "calls_per_block": per_block,
        "p50_ms": {m: round(p50_ms([v for b in latencies[m] for v in b]), 4) for m in ARMS},
        "block_p50_ms": {m: [round(p50_ms(b), 4) for b in latencies[m]] for m in ARMS},
        "guarded_over_plain_block_median": block_ratio("guarded"),
        "aa_plain2_over_plain_block_median": block_ratio("plain2"),
    }


def micro(args: argparse.Namespace) -> dict[str, object]:
    """Microseconds per call of each piece the guard adds, in this process (steadier than
    end-to-end figures on a shared machine): medians of 7 repeats of 20,000 calls."""
    sizes, seed = DEMO_MODELS["small_mlp"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = build_mlp(sizes, seed, "m").SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {"input": np.random.default_rng(1).uniform(-1, 1, (1, 64)).astype(np.float32)}
    level = SessionLevel(0, "L0", lambda: session, ["output"], feeds, session=session)
    chain = FallbackChain("m", session, [level], [Breaker(BreakerPolicy(), time.monotonic)])
    chain.armed = True
    sandbox = InputSandbox({"input": InputLimits(-100, 100, False, False)})
    pieces: dict[str, Callable[[], object]] = {
        "session_run": lambda: session.run(["output"], feeds),
        "chain_run": lambda: chain.run(["output"], feeds),
        "sandbox_check": lambda: sandbox.check(feeds),
        "usable_check": chain.current_level,
        "unmark": lambda: unmark([feeds["input"]]),
    }
    found: dict[str, object] = {}
    for name, piece in pieces.items():
        repeats = []
        for _ in range(7):
            started = time.perf_counter()
            for _ in range(20_000):
                piece()
            repeats.append((time.perf_counter() - started) / 20_000 * 1e6)
        found[f"{name}_us"] = round(statistics.median(repeats), 2)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what", nargs="?", default="both", choices=["switch", "overhead", "interleaved", "micro", "both"]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument(
        "--calls-per-block", type=int, default=2000, help="interleaved: calls per arm per block"
    )
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    result: dict[str, object] = {**machine_stamp()}
    if args.what in ("switch", "both"):
        result["switch"] = switch(args)
        print(json.dumps({k: v for k, v in result["switch"].items() if k != "incidents"}, indent=1))  # type: ignore[union-attr]
    if args.what in ("overhead", "both"):
        result["overhead"] = overhead(args)
        found = result["overhead"]
        assert isinstance(found, dict)
        for key in ("medians", "guarded_over_plain_paired_median", "aa_plain2_over_plain_paired_median"):
            print(key, json.dumps(found[key]))
    if args.what == "interleaved":
        result["interleaved"] = found = interleaved(args)
        print(json.dumps({k: v for k, v in found.items() if k != "block_p50_ms"}, indent=1))
    if args.what in ("micro", "both"):
        result["micro"] = micro(args)
        print("micro", json.dumps(result["micro"]))
    path = OUT / "resilience.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**kept, **result}, indent=2))


if __name__ == "__main__":
    main()
