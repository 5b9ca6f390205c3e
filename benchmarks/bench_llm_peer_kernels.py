"""Which MatMulNBits settings pay on this CPU: decode tokens/s of bench_llm.py's 30.6M decoder
(GroupQueryAttention graph with in-place buffers, as the engine binds them; CPU 0, one thread)
for fp32 and int8 / int4 weights, asymmetric (``ortserve quantize --llm``'s) or symmetric (the
GGUF Q8_0 / Q4_0 weights), ``accuracy_level`` 0 (float32 compute) or 4 (int8 activations),
blocks of 32 or 128; interleaved rounds, medians. ``--profile`` adds ONNX Runtime's per-op
profile (share of the step per operator type) for each variant at 1 row.

Usage: ``python benchmarks/bench_llm_peer_kernels.py [--rounds 3] [--profile]``; writes
benchmarks/out/llm_peer_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.quantize import quantize_matmuls
from ortserve.llm.weights import DecoderShape, DecoderWeights, random_weights

OUT = Path(__file__).parent / "out"
# (name, bits, block, symmetric, accuracy level)
VARIANTS: tuple[tuple[str, int | None, int, bool, int], ...] = (
    ("fp32", None, 32, False, 0),
    ("int8_b32_asym_acc0", 8, 32, False, 0),
    ("int8_b32_sym_acc0", 8, 32, True, 0),
    ("int8_b32_sym_acc4", 8, 32, True, 4),
    ("int8_b128_asym_acc4", 8, 128, False, 4),
    ("int4_b32_asym_acc0", 4, 32, False, 0),
    ("int4_b32_sym_acc0", 4, 32, True, 0),
    ("int4_b32_sym_acc4", 4, 32, True, 4),
    ("int4_b128_asym_acc4", 4, 128, False, 4),
)


def session(
    weights: DecoderWeights,
    bits: int | None,
    block: int,
    symmetric: bool,
    level: int,
    profile: str | None = None,
) -> ort.InferenceSession:
    model: onnx.ModelProto = build_gqa_decoder(weights)
    if bits is not None:
        model, _ = quantize_matmuls(model, bits, block, symmetric, level)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def decode_rate(s: ort.InferenceSession, layers: int, rows: int, steps: int = 16) -> float:
    names = [f"past_key_values.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    presents = [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    buffers = [np.zeros((rows, 2, 512, 64), np.float32) for _ in names]
    started = time.perf_counter()
    for t in range(128, 128 + steps):
        binding = s.io_binding()
        binding.bind_cpu_input("input_ids", np.ones((rows, 1), np.int64))
        binding.bind_cpu_input("position_ids", np.full((rows, 1), t))
        binding.bind_cpu_input("attention_mask", np.ones((rows, t + 1), np.int64))
        binding.bind_output("logits")
        for past, present, buffer in zip(names, presents, buffers, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        s.run_with_iobinding(binding)
    return steps * rows / (time.perf_counter() - started)


def op_profile(weights: DecoderWeights, variant: tuple[str, int | None, int, bool, int]) -> dict[str, float]:
    """Share of node time per operator type over 16 one-row decode steps."""
    name, bits, block, symmetric, level = variant
    with tempfile.TemporaryDirectory() as folder:
        s = session(weights, bits, block, symmetric, level, str(Path(folder) / name))
        decode_rate(s, weights.shape.num_hidden_layers, 1)
        events = json.loads(Path(s.end_profiling()).read_text())
    spent: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            spent[event["args"]["op_name"]] += event["dur"]
    total = sum(spent.values())
    return {op: round(us / total, 3) for op, us in sorted(spent.items(), key=lambda kv: -kv[1])[:6]} | {
        "node_us_per_step": round(total / 16, 1)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    weights = random_weights(DecoderShape(400, 512, 10, 8, 2, 1536), seed=0)
    sessions = {v[0]: session(weights, *v[1:]) for v in VARIANTS}
    rates: dict[str, list[float]] = defaultdict(list)
    for index in range(args.rounds):
        for name, s in sessions.items():
            for rows in (1, 16):
                rates[f"{name}_rows{rows}"].append(decode_rate(s, 10, rows))
        print(f"round {index + 1} done", flush=True)
    medians = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    result: dict[str, object] = {"machine": machine_stamp(), "tokens_per_s_medians": medians, "rounds": rates}
    if args.profile:
        result["op_profile_rows1"] = {v[0]: op_profile(weights, v) for v in VARIANTS}
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "llm_peer_kernels.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
