"""Where one engine step's time goes, on one core: ONNX Runtime's per-operator profile of the
bench_llm.py decoder at the shapes continuous batching runs (decode steps of 1 / 16 rows over
a 192-column cache, a 128-token prefill), with the floating-point work of each, and the numpy
matmul rate of the machine for scale.

The step's FLOPs are counted from the weights (2 per multiply-add of every projection) plus
attention (QK^T and softmax(.)V over the cache); GFLOP/s = FLOPs / median run time.

Usage: ``taskset -c 0 python benchmarks/llm_step_profile.py``; writes benchmarks/out/llm_step_profile.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import build_model
from machine import stamp as machine_stamp

from ortserve.llm.weights import DecoderShape

OUT = Path(__file__).parent / "out"
SHAPES = ((1, 1, 192), (16, 1, 192), (1, 128, 0))
"""(rows, new tokens, cached columns)."""


def feeds(shape: DecoderShape, rows: int, new: int, cached: int) -> dict[str, np.ndarray]:
    total = cached + new
    found: dict[str, np.ndarray] = {
        "input_ids": np.full((rows, new), 5, dtype=np.int64),
        "attention_mask": np.ones((rows, total), dtype=np.int64),
        "position_ids": np.tile(np.arange(cached, total, dtype=np.int64), (rows, 1)),
    }
    past = (rows, shape.num_key_value_heads, cached, shape.head_dim)
    for layer in range(shape.num_hidden_layers):
        for part in ("key", "value"):
            found[f"past_key_values.{layer}.{part}"] = np.zeros(past, dtype=np.float32)
    return found


def flops(shape: DecoderShape, rows: int, new: int, cached: int) -> float:
    d, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
    per_token = shape.num_hidden_layers * (2 * d * d + 2 * d * kv + 3 * d * shape.intermediate_size)
    per_token += d * shape.vocab_size
    keys = cached + (new + 1) / 2  # causal: on average half the new tokens are visible
    attention = shape.num_hidden_layers * 2 * shape.num_attention_heads * shape.head_dim * keys
    return 2.0 * rows * new * (per_token + attention)


def profile(
    path: Path, shape: DecoderShape, rows: int, new: int, cached: int, runs: int
) -> dict[str, object]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(OUT / "ort_profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = feeds(shape, rows, new, cached)
    session.run(names, inputs)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(names, inputs)
        times.append(time.perf_counter() - started)
    events = json.loads(Path(session.end_profiling()).read_text())
    by_op: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    kernels = sum(by_op.values())
    median = statistics.median(times)
    return {
        "rows": rows,
        "new_tokens": new,
        "cached": cached,
        "median_ms": 1e3 * median,
        "gflops": flops(shape, rows, new, cached) / median / 1e9,
        "ops_percent": {op: round(100 * us / kernels, 1) for op, us in by_op.most_common(8)},
    }


def numpy_rate() -> float:
    a = np.random.default_rng(0).standard_normal((128, 512), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((512, 1536), dtype=np.float32)
    a @ b
    started = time.perf_counter()
    for _ in range(50):
        a @ b
    return 2 * 128 * 512 * 1536 * 50 / (time.perf_counter() - started) / 1e9


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shape = build_model(Path(tmp) / "llm30m")
        path = Path(tmp) / "llm30m" / "1" / "model.onnx"
        rows = [profile(path, shape, *s, runs=9) for s in SHAPES]
    for row in rows:
        print(json.dumps(row))
    rate = numpy_rate()
    print(f"numpy 128x512 @ 512x1536: {rate:.1f} GFLOP/s")
    document = {"machine": machine_stamp(), "steps": rows, "numpy_matmul_gflops": rate}
    (OUT / "llm_step_profile.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
