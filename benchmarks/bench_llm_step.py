"""The cost of one decode step with mixed row lengths: the Optimum graph's left-padded batch
(``present = Concat(past, new)``, every row padded to the longest) against the GroupQueryAttention
graph on the in-place KV pool (each row read to its own length, new tokens written in place).

Same weights (bench_llm.py's ~30M decoder), one ONNX Runtime thread, pinned to CPU 0; the two
sides alternate ``--rounds`` times and the medians are reported. Also the cost of the padded
batch's join (rebuilding the batch's tensors when one row joins), which the pool does not pay.

Usage: ``python benchmarks/bench_llm_step.py [--rows 16] [--rounds 5]``; writes
benchmarks/out/llm_step.json.
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

from ortserve.llm.batch import DecodeBatch
from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.graph import build_decoder
from ortserve.llm.weights import DecoderShape, random_weights

OUT = Path(__file__).parent / "out"


def _session(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    shape = DecoderShape(400, 512, 10, 8, 2, 1536)
    weights = random_weights(shape, seed=0)
    padded_session = _session(build_decoder(weights).SerializeToString())
    pooled_session = _session(build_gqa_decoder(weights).SerializeToString())
    layers, kv, hd, rows = shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim, args.rows
    names = [f"past_key_values.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    presents = [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    lengths = sorted(int(n) for n in np.random.default_rng(0).integers(16, 768, rows))
    longest = max(lengths)
    # The padded batch as the old engine held it: right-aligned rows, a mask with holes.
    batch = DecodeBatch(len(names), kv, hd)
    batch.kv = [np.zeros((rows, kv, longest, hd), np.float32) for _ in names]
    batch.mask = np.zeros((rows, longest), np.int64)
    for row, length in enumerate(lengths):
        batch.mask[row, longest - length :] = 1
    ids = np.ones((rows, 1), np.int64)
    positions = np.array([[n] for n in lengths], np.int64)
    pool = [np.zeros((rows, kv, 2048, hd), np.float32) for _ in names]

    def padded_step() -> None:
        mask = np.concatenate([batch.mask, np.ones((rows, 1), np.int64)], axis=1)
        feeds = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            **dict(zip(names, batch.kv)),
        }
        padded_session.run(None, feeds)

    def pooled_step() -> None:
        binding = pooled_session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("position_ids", positions)
        width = longest + 1
        mask = (np.arange(width)[None, :] < (np.array(lengths) + 1)[:, None]).astype(np.int64)
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_output("logits")
        for past, present, buffer in zip(names, presents, pool):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        pooled_session.run_with_iobinding(binding)

    def join_rebuild() -> None:
        joining = DecodeBatch(len(names), kv, hd)
        joining.kv, joining.mask, joining.rows = batch.kv, batch.mask, list(range(rows))  # type: ignore[arg-type]
        joining.join([(object(), [np.zeros((1, kv, 100, hd), np.float32) for _ in names])])  # type: ignore[list-item]

    def timed(run: object, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            run()  # type: ignore[operator]
        return (time.perf_counter() - started) / steps * 1e3

    for run in (padded_step, pooled_step):
        run()
    results: dict[str, list[float]] = {"padded_ms": [], "pooled_ms": [], "padded_join_rebuild_ms": []}
    for _ in range(args.rounds):
        results["padded_ms"].append(timed(padded_step, args.steps))
        results["pooled_ms"].append(timed(pooled_step, args.steps))
        results["padded_join_rebuild_ms"].append(timed(join_rebuild, 3))
    medians = {k: statistics.median(v) for k, v in results.items()}
    medians["pooled_vs_padded"] = medians["pooled_ms"] / medians["padded_ms"]
    medians["row_lengths_sum"] = float(sum(lengths))
    medians["rows_x_longest"] = float(rows * longest)
    print(json.dumps({"lengths": lengths, **{k: round(v, 3) for k, v in medians.items()}}, indent=2))
    OUT.mkdir(exist_ok=True)
    document = {"machine": machine_stamp(), "lengths": lengths, "rounds": results, "medians": medians,
                "load": os.getloadavg()}  # fmt: skip
    (OUT / "llm_step.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
