"""The LLM's KV backends on the CPU: the host pool (what a CPU session serves with, unchanged)
against the device pool run on ``cpu`` OrtValues (llm/device_kv.py, the code a CUDA session
runs, its copies done with host memmoves), interleaved A/B/A' in rounds; greedy tokens checked
equal. On the CPU the server never takes the device pool: this measures what the bound path
itself costs, the figure a GPU run compares against.

    taskset -c 1 python benchmarks/bench_device_kv.py [--rounds 3] [--sequences 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortserve.core.binding import DeviceSpec
from ortserve.core.cuda_ipc import HostMemory
from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.device_kv import DevicePooledBackend
from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
from ortserve.llm.kv_backend import KvBackend
from ortserve.llm.layout import check_graph, read_llm_files
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import Sequence
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.llm.weights import DecoderShape, random_weights

CONTEXT = 512


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-device-kv-"))
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 8], 256)
    shape = DecoderShape(
        tokenizer.get_vocab_size(), args.hidden, args.layers, 8, 2, 4 * args.hidden, 10000.0, 1e-5, CONTEXT
    )
    write_llm_version(folder, random_weights(shape, seed=3), tokenizer, layout="genai")
    files = read_llm_files(folder)
    text = TextTokenizer(folder, files.tokenizer_config)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def signature(items: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
        return {a.name: (a.type, list(a.shape)) for a in items}

    layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, files.vocab_size, 32)] for _ in range(args.sequences)]

    def run(device: bool) -> tuple[float, list[list[int]]]:
        decoder = DecoderSession(session, layout)
        limits = EngineLimits(max_num_seqs=args.sequences, max_context_len=CONTEXT, max_itl_ms=60_000.0)
        backend: KvBackend | None = None
        if device:
            backend = DevicePooledBackend(
                decoder, CONTEXT, limits.kv_pool_bytes, DeviceSpec("cpu"), HostMemory()
            )
        engine = GenerationEngine(
            decoder, limits, PrefixCache(0, 1.0, time.monotonic, 16), lambda _: None, backend=backend
        )
        engine.tune(0.001, 0.0001)
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
        sequences = [Sequence(p, params, text, (), CONTEXT) for p in prompts]
        started = time.perf_counter()
        for sequence in sequences:
            engine.submit(sequence)
        while any(s.finish_reason is None for s in sequences):
            engine.step()
        elapsed = time.perf_counter() - started
        outputs = [list(s.output) for s in sequences]
        return sum(len(o) for o in outputs) / elapsed, outputs

    run(False)
    run(True)  # warm both
    host_a, device, host_b = [], [], []
    for _ in range(args.rounds):
        rate, want = run(False)
        host_a.append(rate)
        rate, got = run(True)
        device.append(rate)
        assert got == want, "the device pool's greedy tokens differ from the host pool's"
        host_b.append(run(False)[0])
    a, b, a2 = (statistics.median(x) for x in (host_a, device, host_b))
    print(
        f"LLM {args.layers} layers hidden {args.hidden}, {args.sequences} x {args.tokens} tokens: "
        f"host pool A {a:.0f} tok/s, A' {a2:.0f} tok/s (A'/A {a2 / a:.3f}); device pool on cpu OrtValues "
        f"{b:.0f} tok/s ({b / ((a + a2) / 2):.3f}x); greedy tokens equal in every round"
    )


if __name__ == "__main__":
    main()
