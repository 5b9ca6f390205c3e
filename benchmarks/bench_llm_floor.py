"""The kernel floor of issue 28's workloads: what ONNX Runtime alone needs, in process, for the
decode steps and prefill chunks that a served run of bench_llm_vllm_mixed.py's traffic is made
of, and so the most output tokens/s any scheduler on top of it could reach on one core.

Why: a served ratio against vLLM-CPU mixes the server's scheduling with the kernels. When the
bare kernels' bound is below the target (1.3x vLLM's served tokens/s), no scheduling reaches it
and the gap is ONNX Runtime's, which this measures with nothing of ortserve's serving around it.

Same graph and binding as the engine (bench_llm.py's 30.6M decoder, seed 0, GroupQueryAttention
with the KV pool bound in place, one thread, CPU 0). Measured, interleaved over ``--rounds``,
medians:

- a decode step of 16 rows whose cached lengths follow the workload (prompt plus progress);
- a prefill chunk of ``--chunk`` tokens into an empty row, as seconds per prompt token.

The floor of a request is ``prompt x prefill_token + output x step / 16``; the bound is the
workload's mean output over its mean floor. Workloads: mixed (prompts 16-512, outputs 16-256,
uniform, as bench_llm_mixed's sampler) and uniform 128 / 128.

Usage: ``python benchmarks/bench_llm_floor.py [--rounds 5] [--vllm-mixed TOKENS_S
--vllm-uniform TOKENS_S]``; writes benchmarks/out/llm_floor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.weights import DecoderShape, random_weights

OUT = Path(__file__).parent / "out"
POOL = 1024  # tokens per row: the longest mixed sequence (512 + 256) fits
WORKLOADS = {"mixed": ((16, 512), (16, 256)), "uniform": ((128, 128), (128, 128))}


class Kernels:
    """The decoder session and its in-place buffers, bound as the engine binds them."""

    def __init__(self, rows: int, profile: bool = False) -> None:
        shape = DecoderShape(400, 512, 10, 8, 2, 1536)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_profiling = profile
        model = build_gqa_decoder(random_weights(shape, seed=0)).SerializeToString()
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        layers, kv, hd = shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim
        self.names = [
            (f"past_key_values.{i}.{p}", f"present.{i}.{p}") for i in range(layers) for p in ("key", "value")
        ]
        self.pool = [np.zeros((rows, kv, POOL, hd), np.float32) for _ in self.names]
        self.single = [np.zeros((1, kv, POOL, hd), np.float32) for _ in self.names]

    def run(self, ids: np.ndarray, lengths: list[int], buffers: list[np.ndarray]) -> None:
        """One call: ``ids`` [rows, new] after each row's cached ``lengths``."""
        new = ids.shape[1]
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input(
            "position_ids", np.array([[n + j for j in range(new)] for n in lengths], np.int64)
        )
        width = max(lengths) + new
        binding.bind_cpu_input(
            "attention_mask",
            (np.arange(width)[None, :] < (np.array(lengths) + new)[:, None]).astype(np.int64),
        )
        binding.bind_output("logits")
        for (past, present), buffer in zip(self.names, buffers):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self.session.run_with_iobinding(binding)


def _lengths(rng: np.random.Generator, workload: str, rows: int) -> list[int]:
    """Cached lengths of ``rows`` running streams: a prompt and part of its output."""
    (p_lo, p_hi), (o_lo, o_hi) = WORKLOADS[workload]
    prompts = rng.integers(p_lo, p_hi + 1, rows)
    outputs = rng.integers(o_lo, o_hi + 1, rows)
    return [int(p + rng.integers(0, o)) for p, o in zip(prompts, outputs)]


def profile_step(rows: int, lengths: list[int], steps: int = 20) -> dict[str, float]:
    """Milliseconds per decode step by operator type (ONNX Runtime's profiler): the part of the
    step that the matrix products alone take, which no graph rewrite around them removes."""
    kernels = Kernels(rows, profile=True)
    ids = np.full((rows, 1), 5, np.int64)
    for _ in range(steps + 1):
        kernels.run(ids, lengths, kernels.pool)
    trace = json.loads(Path(kernels.session.end_profiling()).read_text())
    per_op: dict[str, float] = {}
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_run_end = runs[0]["ts"] + runs[0]["dur"] if runs else 0
    for event in trace:
        if (
            event.get("cat") == "Node"
            and event["name"].endswith("_kernel_time")
            and event["ts"] > first_run_end
        ):
            op = event.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + event["dur"] / 1e3 / steps
    per_op["model_run"] = statistics.median(r["dur"] for r in runs[1:]) / 1e3 if len(runs) > 1 else 0.0
    return dict(sorted(per_op.items(), key=lambda item: -item[1]))


def _timed(call: Callable[[], None], repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=256, help="prefill chunk, tokens")
    parser.add_argument("--vllm-mixed", type=float, default=0.0, help="vLLM's served mixed tokens/s")
    parser.add_argument("--vllm-uniform", type=float, default=0.0, help="vLLM's served uniform tokens/s")
    parser.add_argument("--profile", action="store_true", help="ms per step by operator type, 16 mixed rows")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    kernels = Kernels(args.rows)
    rng = np.random.default_rng(0)
    ids = np.full((args.rows, 1), 5, np.int64)
    chunk = np.full((1, args.chunk), 5, np.int64)
    samples: dict[str, list[float]] = {f"{w}_step_s": [] for w in WORKLOADS} | {"prefill_token_s": []}
    steps = {w: _lengths(rng, w, args.rows) for w in WORKLOADS}
    for workload in WORKLOADS:  # warm the session's shapes
        kernels.run(ids, steps[workload], kernels.pool)
    kernels.run(chunk, [0], kernels.single)
    for _ in range(args.rounds):
        for workload in WORKLOADS:
            step = steps[workload]
            samples[f"{workload}_step_s"].append(_timed(lambda s=step: kernels.run(ids, s, kernels.pool), 10))
        per_chunk = _timed(lambda: kernels.run(chunk, [0], kernels.single), 4)
        samples["prefill_token_s"].append(per_chunk / args.chunk)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    bounds: dict[str, float] = {}
    lines = []
    for workload, ((p_lo, p_hi), (o_lo, o_hi)) in WORKLOADS.items():
        prompt, output = (p_lo + p_hi) / 2, (o_lo + o_hi) / 2
        floor = prompt * medians["prefill_token_s"] + output * medians[f"{workload}_step_s"] / args.rows
        bounds[workload] = output / floor
        peer = args.vllm_mixed if workload == "mixed" else args.vllm_uniform
        lines.append(
            f"{workload}: step at {args.rows} rows {medians[f'{workload}_step_s'] * 1e3:.2f} ms, "
            f"prefill {medians['prefill_token_s'] * 1e6:.0f} us/token; floor per request {floor * 1e3:.0f} ms; "
            f"bound {bounds[workload]:.0f} output tokens/s"
            + (f" = {bounds[workload] / peer:.2f}x vLLM's served {peer:.0f} (target 1.3x)" if peer else "")
        )
    profile = profile_step(args.rows, steps["mixed"]) if args.profile else {}
    if profile:
        lines.append(
            "mixed step by operator (ms): "
            + ", ".join(f"{op} {ms:.2f}" for op, ms in list(profile.items())[:8])
        )
    print("\n".join(lines))
    OUT.mkdir(exist_ok=True)
    document = {"machine": machine_stamp(), "args": vars(args), "steps": steps, "samples": samples,
                "medians": medians, "bounds": bounds, "profile_ms": profile, "verdict": lines, "load": os.getloadavg()}  # fmt: skip
    (OUT / "llm_floor.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
