"""int4 / int8 MatMulNBits weights against fp32: decode tokens/s of bench_llm.py's 30.6M decoder
(1 and 16 rows, in-place buffers as the engine binds them, CPU 0, one thread, interleaved
rounds) and the demo LLM's perplexity on the last 20% of its corpus documents.

Usage: ``python benchmarks/bench_llm_quantized.py [--rounds 5]``; writes
benchmarks/out/llm_quantized.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ortserve.llm.demo import corpus_documents, demo_weights
from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.quantize import quantize_matmuls
from ortserve.llm.weights import DecoderShape, DecoderWeights, random_weights

OUT = Path(__file__).parent / "out"
KINDS: tuple[tuple[str, int | None, int], ...] = (
    ("fp32", None, 32), ("int8_b32", 8, 32), ("int8_b128", 8, 128), ("int4_b32", 4, 32), ("int4_b128", 4, 128)
)  # fmt: skip


def session(weights: DecoderWeights, bits: int | None, block: int) -> ort.InferenceSession:
    model: onnx.ModelProto = build_gqa_decoder(weights)
    if bits is not None:
        model, _ = quantize_matmuls(model, bits, block)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def perplexity(s: ort.InferenceSession, weights: DecoderWeights, sequences: list[list[int]]) -> float:
    shape = weights.shape
    nll, count = 0.0, 0
    for tokens in sequences:
        ids = np.array(tokens[:-1], np.int64)[None]
        feeds: dict[str, object] = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(ids.shape[1])[None],
        }
        for layer in range(shape.num_hidden_layers):
            for part in ("key", "value"):
                empty = np.zeros((1, shape.num_key_value_heads, 0, shape.head_dim), np.float32)
                feeds[f"past_key_values.{layer}.{part}"] = empty
        logits = s.run(["logits"], feeds)[0][0].astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(tokens) - 1), tokens[1:]].sum())
        count += len(tokens) - 1
    return float(np.exp(nll / count))


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
        for past, present, buffer in zip(names, presents, buffers):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        s.run_with_iobinding(binding)
    return steps * rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    demo, tokenizer = demo_weights()
    documents = corpus_documents()
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert eos is not None
    held = [[*tokenizer.encode(d).ids, eos] for d in documents[int(len(documents) * 0.8) :]]
    result: dict[str, float] = {}
    for name, bits, block in KINDS:
        result[f"demo_perplexity_{name}"] = perplexity(session(demo, bits, block), demo, held)
    bench = random_weights(DecoderShape(400, 512, 10, 8, 2, 1536), seed=0)
    sessions = {name: session(bench, bits, block) for name, bits, block in KINDS if block == 32}
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, s in sessions.items():
            for rows in (1, 16):
                rates.setdefault(f"{name}_rows{rows}_tokens_per_s", []).append(decode_rate(s, 10, rows))
    result |= {k: statistics.median(v) for k, v in rates.items()}
    print(json.dumps(result, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "llm_quantized.json").write_text(json.dumps({"medians": result, "rounds": rates}, indent=2))


if __name__ == "__main__":
    main()
