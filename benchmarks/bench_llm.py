"""Text generation on one core: ortserve's engine against a sequential loop and a bare
in-process ONNX Runtime loop, plus the follow-up-turn time to first token with the prefix cache.

Model: a ~30M-parameter Llama-style decoder (10 layers, hidden 512, 8 heads, 2 KV heads,
SwiGLU 1536), random weights, the demo's 400-token BPE vocabulary, fp32, built here with
numpy + onnx.helper. The server runs pinned to CPU 0 with one ONNX Runtime thread; the
client (this process) is pinned to CPU 1; the bare loop runs in a child pinned to CPU 0.

- bare loop: prefill 128 tokens, 128 greedy decode steps feeding ``present`` back as past,
  one request after another (tokens/s over prefill + decode, as a client would see it),
  alternated ``--rounds`` times with ortserve at one stream (the sequential loop), medians;
- ortserve at 4 / 16 / 64 concurrent streams: streamed /v1/completions, 128-token
  prompts, 128 output tokens (``ignore_eos``), output tokens/s, TTFT and ITL percentiles;
  levels of 64 streams and more get ``--long-duration`` (one 128-token request at 64 streams
  outlasts a 20 s window);
- follow-up turn: a 512-token history (first turn: nothing cached) then the same history
  plus 16 new tokens (second turn: history in the prefix cache); TTFT of each, 5 pairs.

Usage: ``python benchmarks/bench_llm.py [--duration 20] [--rounds 3] [--long-duration 90]``;
writes benchmarks/out/llm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.llm.demo import corpus_documents, train_tokenizer, write_llm_version
from ortserve.llm.weights import DecoderShape, random_weights
from ortserve.loadtest.llm_load import LlmLevel, LlmRequestSpec, run_llm_level, stream_completion
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
SHAPE = dict(
    hidden_size=512,
    num_hidden_layers=10,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=1536,
)
CONFIG = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 64\n  max_waiting: 256\n"

BARE_LOOP = r"""
import sys, time, json
import numpy as np, onnxruntime as ort
path, layers, kv, hd, prompt, steps, rounds = sys.argv[1], *map(int, sys.argv[2:8])
options = ort.SessionOptions(); options.intra_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]
rng = np.random.default_rng(0)
rates = []
for measured in [False] + [True] * rounds:  # one unmeasured request first, as the server warms up
    started = time.perf_counter()
    ids = rng.integers(3, 256, (1, prompt), dtype=np.int64)
    past = {f"past_key_values.{i}.{p}": np.zeros((1, kv, 0, hd), np.float32) for i in range(layers) for p in ("key", "value")}
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, prompt), np.int64), "position_ids": np.arange(prompt)[None], **past}
    for step in range(steps):
        out = session.run(names, feeds)
        token = int(out[0][0, -1].argmax())
        length = prompt + step + 1
        feeds = {"input_ids": np.array([[token]]), "attention_mask": np.ones((1, length), np.int64),
                 "position_ids": np.array([[length - 1]])}
        feeds.update({f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}": v for i, v in enumerate(out[1:])})
    if measured:
        rates.append(steps / (time.perf_counter() - started))
print(json.dumps(rates))
"""


def build_model(folder: Path, max_num_seqs: int = 64) -> DecoderShape:
    tokenizer = train_tokenizer(corpus_documents(), 400)
    shape = DecoderShape(tokenizer.get_vocab_size(), **SHAPE)  # type: ignore[arg-type]
    write_llm_version(folder / "1", random_weights(shape, seed=0), tokenizer)
    (folder / "config.yaml").write_text(CONFIG.replace("max_num_seqs: 64", f"max_num_seqs: {max_num_seqs}"))
    return shape


def bare_loop(model: Path, shape: DecoderShape, prompt: int, steps: int, rounds: int) -> list[float]:
    args = [str(model), str(shape.num_hidden_layers), str(shape.num_key_value_heads), str(shape.head_dim)]
    result = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", BARE_LOOP, *args, str(prompt), str(steps), str(rounds)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return [float(x) for x in json.loads(result.stdout)]


async def follow_ups(url: str, model: str, pairs: int) -> list[tuple[float, float, int]]:
    """(first-turn TTFT, follow-up TTFT, cached tokens) for ``pairs`` conversations."""
    rng = np.random.default_rng(1)
    spec = LlmRequestSpec(model, max_tokens=16)
    results = []
    for _ in range(pairs):
        history = [int(t) for t in rng.integers(3, 256, 512)]
        first = await stream_completion(url, spec, history)
        second = await stream_completion(url, spec, history + [int(t) for t in rng.integers(3, 256, 16)])
        assert first.first is not None and second.first is not None
        results.append((first.first - first.started, second.first - second.started, second.cached_tokens))
    return results


def single_stream_rounds(
    url: str, model: Path, shape: DecoderShape, rounds: int, duration: float
) -> tuple[list[float], list[LlmLevel]]:
    """Alternate the bare loop (2 requests) and ortserve at one stream, ``rounds`` times: the
    same minutes of the shared machine for both sides of the ratio."""
    bare: list[float] = []
    singles = []
    for index in range(rounds):
        bare += bare_loop(model, shape, 128, 128, 2)
        spec = LlmRequestSpec("llm30m", 128, 128, seed=1 + index)  # new prompts: no prefix-cache hits
        singles.append(asyncio.run(run_llm_level(url, spec, 1, duration, 2.0)))
        print(
            f"round: bare {[round(r, 1) for r in bare[-2:]]}, ortserve c=1 {singles[-1].tokens_per_s:.1f} tokens/s",
            flush=True,
        )
    return bare, singles


def engine_seconds(url: str) -> tuple[float, float, float]:
    """(engine steps, seconds in steps, seconds inside ONNX Runtime) from the server's metrics."""
    found = {}
    with urllib.request.urlopen(f"{url}/metrics") as reply:
        for line in reply.read().decode().splitlines():
            for name in ("engine_steps", "engine_step_seconds", "model_run_seconds"):
                if line.startswith(f"ortserve_llm_{name}_total{{"):
                    found[name] = float(line.rsplit(" ", 1)[1])
    return found["engine_steps"], found["engine_step_seconds"], found["model_run_seconds"]


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the server's main thread (the event loop: HTTP, SSE) and of all others."""
    tick = os.sysconf("SC_CLK_TCK")
    main, rest = 0.0, 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        if task.name == str(pid):
            main += seconds
        else:
            rest += seconds
    return main, rest


def measured_level(
    server: ServerProcess, spec: LlmRequestSpec, concurrency: int, window: float
) -> tuple[LlmLevel, dict[str, float]]:
    """One level, and where the server's core went during it: inside ONNX Runtime, in the
    engine's own step code (sampling, detokenizing, batch bookkeeping), and on the event loop
    (HTTP, SSE: the main thread's CPU time; it shares the core, so it also stretches runs)."""
    url, pid = server.http_url, server.process.pid
    before, cpu_before, started = engine_seconds(url), thread_cpu(pid), time.perf_counter()
    level = asyncio.run(run_llm_level(url, spec, concurrency, window, 3.0))
    after, cpu_after, wall = engine_seconds(url), thread_cpu(pid), time.perf_counter() - started
    steps, step_s, run_s = (b - a for a, b in zip(before, after))
    loop_cpu, other_cpu = (b - a for a, b in zip(cpu_before, cpu_after))
    split = {
        "wall_s": wall,
        "steps": steps,
        "ms_per_step": 1e3 * step_s / steps if steps else 0.0,
        "model_run_fraction": run_s / wall,
        "engine_outside_run_fraction": (step_s - run_s) / wall,
        "outside_steps_fraction": 1 - step_s / wall,
        "event_loop_cpu_fraction": loop_cpu / wall,
        "other_threads_cpu_fraction": other_cpu / wall,
    }
    return level, split


def print_level(level: LlmLevel) -> None:
    print(
        f"c={level.concurrency}: {level.tokens_per_s:.1f} tokens/s over {level.seconds:.0f} s, {level.requests} requests, "
        f"{level.failures} failed, TTFT p50 {level.ttft_s.get('p50', 0) * 1e3:.0f} ms "
        f"p99 {level.ttft_s.get('p99', 0) * 1e3:.0f} ms, ITL p50 {level.itl_s.get('p50', 0) * 1e3:.1f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--levels", default="4,16,64")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of bare loop / one stream")
    parser.add_argument("--long-duration", type=float, default=90.0, help="window of levels >= 64 streams")
    parser.add_argument("--no-follow-ups", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the engine's decode batch bound")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        shape = build_model(root / "llm30m", args.max_num_seqs)
        onnx_path = root / "llm30m" / "1" / "model.onnx"
        print(f"model: {shape.parameters() / 1e6:.1f}M parameters", flush=True)
        with run_server(root, Path(tmp) / "server.log", ["--intra-op-threads", "1"], pin_cpu=0) as server:
            bare, singles = single_stream_rounds(
                server.http_url, onnx_path, shape, args.rounds, args.duration
            )
            spec = LlmRequestSpec("llm30m", 128, 128)
            levels = []
            splits: dict[int, dict[str, float]] = {}
            for concurrency in [int(c) for c in args.levels.split(",") if c]:
                window = args.long_duration if concurrency >= 64 else args.duration
                level, split = measured_level(server, spec, concurrency, window)
                levels.append(level)
                splits[concurrency] = split
                print_level(level)
                print(f"  server core: {json.dumps({k: round(v, 3) for k, v in split.items()})}", flush=True)
            turns = [] if args.no_follow_ups else asyncio.run(follow_ups(server.http_url, "llm30m", 5))
    one = statistics.median(level.tokens_per_s for level in singles)
    summary: dict[str, float] = {
        "bare_tokens_per_s": statistics.median(bare),
        "c1_tokens_per_s": one,
        "c1_vs_bare": one / statistics.median(bare),
    }
    if any(lv.concurrency == 16 for lv in levels):
        summary["c16_vs_sequential"] = next(lv.tokens_per_s for lv in levels if lv.concurrency == 16) / one
    if turns:
        first = statistics.median(t[0] for t in turns)
        second = statistics.median(t[1] for t in turns)
        print(f"follow-up turn over 512 tokens: first {first * 1e3:.0f} ms, follow-up {second * 1e3:.0f} ms, "
              f"ratio {second / first:.2f}, cached {[t[2] for t in turns]}")  # fmt: skip
        summary["follow_up_ttft_ratio"] = second / first
    summary_load = {"load_before": load_before, "load_after": os.getloadavg()}
    print(json.dumps({**summary, **summary_load}, indent=2))
    document = {
        "machine": machine_stamp(),
        "model": {"parameters": shape.parameters(), **SHAPE, "vocab_size": shape.vocab_size},
        "bare_loop_tokens_per_s": bare,
        "single_stream_levels": [lv.as_dict() for lv in singles],
        "levels": [lv.as_dict() for lv in levels],
        "server_core_split": splits,
        "follow_up_turns": [
            {"first_ttft_s": a, "follow_up_ttft_s": b, "cached_tokens": c} for a, b, c in turns
        ],
        "summary": summary,
        **summary_load,
    }
    (OUT / "llm.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
