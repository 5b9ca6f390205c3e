"""One engine step with a prompt chunk: the decode and the chunk as two runs of the plain
GroupQueryAttention graph, against one run of the step graph (llm/fused_graph.py), which reads
the weights once.

Same weights (bench_llm.py's 30.6M decoder, random, seed 0), one ONNX Runtime thread, pinned to
CPU 0; the rows hold ``--context`` tokens, the chunk starts after 200 of its prompt's. The two
sides alternate within each of ``--rounds`` rounds and the medians are reported, with the
largest logit difference between them (the same weights and keys and values: 0 expected).

Usage: ``python benchmarks/bench_llm_fused_step.py [--rounds 15]``; writes
benchmarks/out/llm_fused_step.json.
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

from ortserve.llm.fused_graph import build_fused_decoder
from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.kv_backend import DecoderSession, StepFeeds
from ortserve.llm.layout import DecoderLayout
from ortserve.llm.weights import DecoderShape, random_weights

OUT = Path(__file__).parent / "out"
SHAPE = DecoderShape(400, 512, 10, 8, 2, 1536)


def _session(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _feeds(pool: list[np.ndarray], rows: int, context: int, chunk: int) -> tuple[StepFeeds, StepFeeds]:
    rng = np.random.default_rng(rows * 1000 + chunk)
    decode = StepFeeds(
        rng.integers(3, SHAPE.vocab_size, (rows, 1)),
        np.full((rows, 1), context - 1, dtype=np.int64),
        [context] * rows,
        [part[:rows] for part in pool],
    )
    start = 200
    prompt = StepFeeds(
        rng.integers(3, SHAPE.vocab_size, (1, chunk)),
        np.arange(start, start + chunk, dtype=np.int64)[None],
        [start + chunk],
        [part[rows : rows + 1] for part in pool],
    )
    return decode, prompt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--context", type=int, default=300)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    weights = random_weights(SHAPE, seed=0)
    plain = _session(build_gqa_decoder(weights).SerializeToString())
    layers, hd = SHAPE.num_hidden_layers, SHAPE.head_dim
    names = tuple(o.name for o in plain.get_outputs())
    decoder = DecoderSession(
        plain, DecoderLayout(layers, SHAPE.num_key_value_heads, hd, True, False, names, True)
    )
    decoder.fused = _session(build_fused_decoder(weights).SerializeToString())
    cases = []
    for rows, chunk in ((12, 32), (20, 32), (20, 64), (24, 48), (20, 128)):
        shape = (rows + 1, SHAPE.num_key_value_heads, 1024, hd)
        pool = [np.random.default_rng(1).standard_normal(shape).astype(np.float32) for _ in range(2 * layers)]
        decode, prompt = _feeds(pool, rows, args.context, chunk)
        apart_s, together_s, worst = [], [], 0.0
        for _ in range(args.rounds):
            started = time.perf_counter()
            first = decoder.run_in_place(decode.ids, decode.positions, decode.lengths, decode.buffers)
            second = decoder.run_in_place(prompt.ids, prompt.positions, prompt.lengths, prompt.buffers)
            apart_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            both = decoder.run_fused(decode, prompt)
            together_s.append(time.perf_counter() - started)
            worst = max(worst, float(np.abs(both - np.concatenate([first, second])).max()))
        apart, together = statistics.median(apart_s), statistics.median(together_s)
        cases.append(
            {"rows": rows, "chunk": chunk, "separate_ms": round(1e3 * apart, 2),
             "fused_ms": round(1e3 * together, 2), "saved_ms": round(1e3 * (apart - together), 2),
             "max_logit_difference": worst}
        )  # fmt: skip
        print(json.dumps(cases[-1]), flush=True)
    OUT.mkdir(exist_ok=True)
    result = {"machine": machine_stamp(), "context": args.context, "rounds": args.rounds, "cases": cases}
    (OUT / "llm_fused_step.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
