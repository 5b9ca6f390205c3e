"""ortserve against llama.cpp's ``llama-server`` on the same weights, one core each.

bench_llm.py's 30.6M decoder (random weights, seed 0; the 400-token BPE of the demo corpus) is
written for ortserve (the genai layout: GroupQueryAttention over the in-place KV pool) and, by
``bench_llm_peer_gguf.py`` under a Python with the ``gguf`` package, as GGUF files with q/k
permuted as ``convert_hf_to_gguf.py`` does. Three pairs, each from the same float weights:

- ``fp32``: ortserve fp32 against GGUF F32;
- ``int8``: ortserve MatMulNBits 8-bit, symmetric, block 32 against GGUF Q8_0: the same codes
  and float16 scales (``quantize_matmuls(symmetric=True)`` rounds as GGML does);
- ``int4``: ortserve MatMulNBits 4-bit, symmetric, block 32 against GGUF Q4_0, likewise.

ortserve's quantized MatMuls use ``--accuracy-level`` (default 4: int8 activations, as
llama.cpp's quantized dot products use). Before any figure counts, the greedy text of a probe
prompt must be equal from both servers (the fp32 pair: the same weights; the quantized pairs:
the same weights, but each multiplies with activations rounded its own way, so a difference
is reported, not fatal). Perplexity of each model on the demo corpus's last 20% of documents
(the same token ids): ortserve's in process (ONNX Runtime, the served graph), llama.cpp's
through its server (one token at a time, ``n_probs`` over the whole vocabulary, the prompt
cached).

Load: closed loop at 1 and 16 streams, streamed /v1/completions with token-id prompts,
``ignore_eos``, greedy: uniform 128 in / 128 out, and mixed (prompts 16-512, outputs 16-256, as
bench_llm_mixed.py). Output tokens/s, TTFT, ITL, TPOT. Each server pinned to CPU 0 (ortserve
with one ONNX Runtime thread, llama-server with ``-t 1 -tb 1``), this client on CPU 1; runs
interleaved ortserve / llama.cpp / ortserve again per pair, so the drift shows.

llama-server is not built or fetched by this script: pass its path (``--llama-server``), and
the Python with ``gguf`` (``--gguf-python``).

Usage: ``python benchmarks/bench_llm_peer.py --llama-server PATH --gguf-python PATH
[--pairs fp32,int8,int4] [--cells uniform_c1,...] [--duration 20]``; writes
benchmarks/out/llm_peer.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import CONFIG, SHAPE
from bench_llm_mixed import Run, _one, summary
from bench_llm_quantized import perplexity
from llm_checkpoint import hf_tensors
from machine import stamp as machine_stamp

from ortserve.llm.demo import EOS_TOKEN, corpus_documents, train_tokenizer, write_llm_version
from ortserve.llm.quantize import quantize_llm_folder
from ortserve.llm.weights import DecoderShape, DecoderWeights, random_weights
from ortserve.testing import free_port, run_server

OUT = Path(__file__).parent / "out"
MODEL = "llm30m"
PROBE = [5 + (i * 37) % 250 for i in range(64)]
PAIRS = {"fp32": (None, "F32"), "int8": (8, "Q8_0"), "int4": (4, "Q4_0")}


def build(
    root: Path, gguf_python: str, pairs: list[str], level: int
) -> tuple[DecoderWeights, list[list[int]]]:
    """Write every ortserve repository and GGUF file; returns the weights and the held-out
    token sequences."""
    documents = corpus_documents()
    tokenizer = train_tokenizer(documents, 400)
    shape = DecoderShape(tokenizer.get_vocab_size(), **SHAPE)  # type: ignore[arg-type]
    weights = random_weights(shape, seed=0)
    fp32 = root / "ort_fp32" / MODEL / "1"
    write_llm_version(fp32, weights, tokenizer, layout="genai")
    for pair in pairs:
        bits, _ = PAIRS[pair]
        (root / f"ort_{pair}" / MODEL).mkdir(parents=True, exist_ok=True)
        (root / f"ort_{pair}" / MODEL / "config.yaml").write_text(CONFIG)
        if bits is not None:
            quantize_llm_folder(fp32, root / f"ort_{pair}" / MODEL / "1", bits, 32, True, level)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    assert [i for _, i in vocab] == list(range(shape.vocab_size))
    eos = tokenizer.token_to_id(EOS_TOKEN)
    types = [3 if token == EOS_TOKEN else 2 if token == "<unk>" else 1 for token, _ in vocab]
    meta = {
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "intermediate_size": shape.intermediate_size,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_position_embeddings,
        "tokens": [token for token, _ in vocab],
        "token_types": types,
        "unk_id": tokenizer.token_to_id("<unk>"),
        "bos_id": eos,
        "eos_id": eos,
    }
    np.savez(root / "weights.npz", **hf_tensors(weights))
    (root / "meta.json").write_text(json.dumps(meta))
    writer = Path(__file__).parent / "bench_llm_peer_gguf.py"
    for pair in pairs:
        kind = PAIRS[pair][1]
        subprocess.run(
            [gguf_python, str(writer), str(root / "weights.npz"), str(root / "meta.json"), str(root / f"{kind}.gguf"), kind],
            check=True,
        )  # fmt: skip
    held = [[*tokenizer.encode(d).ids, eos] for d in documents[int(len(documents) * 0.8) :]]
    print(
        f"model: {shape.parameters() / 1e6:.1f}M parameters; held-out tokens {sum(map(len, held))}",
        flush=True,
    )
    return weights, held


@contextlib.contextmanager
def llama_server(binary: str, model: Path, log: Path, pids: list[int] | None = None) -> Iterator[str]:
    """``llama-server`` on CPU 0 with one thread and 16 slots; yields its URL (``pids``: gets
    its process id, for its CPU time)."""
    port = free_port()
    args = [
        "taskset", "-c", "0", binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-t", "1", "-tb", "1", "-np", "16", "-c", str(16 * 1024), "--no-webui", "--metrics",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    if pids is not None:
        pids.append(process.pid)  # taskset execs the server: the same process
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited {process.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("llama-server not ready in 300 s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _post(url: str, path: str, body: dict[str, object], timeout: float = 300) -> dict[str, object]:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer: dict[str, object] = json.loads(reply.read())
        return answer


def greedy_text(url: str) -> str:
    body = {"model": MODEL, "prompt": PROBE, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    answer = _post(url, "/v1/completions", body)
    return str(answer["choices"][0]["text"])  # type: ignore[index]


def llama_perplexity(url: str, held: list[list[int]], vocab: int) -> float:
    """One token at a time: the probability of each next token from the whole vocabulary's
    softmax (``temperature`` < 0: raw logits), the prefix cached in the slot."""
    nll, count = 0.0, 0
    for tokens in held:
        for t in range(1, len(tokens)):
            body = {
                "prompt": tokens[:t],
                "n_predict": 1,
                "n_probs": vocab,
                "temperature": -1,
                "cache_prompt": True,
            }
            answer = _post(url, "/completion", body)
            probs = answer.get("completion_probabilities") or answer["probs"]  # the name varies by version
            top = probs[0]["top_logprobs"]  # type: ignore[index]
            logprob = next(float(p["logprob"]) for p in top if int(p["id"]) == tokens[t])
            nll -= logprob
            count += 1
    return float(np.exp(nll / count))


def ort_perplexity(version: Path, weights: DecoderWeights, held: list[list[int]]) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(version / "model.onnx"), options, providers=["CPUExecutionProvider"])
    return perplexity(session, weights, held)


def _uniform(rng: random.Random) -> tuple[list[int], int]:
    return [rng.randrange(3, 256) for _ in range(128)], 128


def _mixed(rng: random.Random) -> tuple[list[int], int]:
    return [rng.randrange(3, 256) for _ in range(rng.randint(16, 512))], rng.randint(16, 256)


async def closed(url: str, streams: int, duration: float, seed: int, mixed: bool) -> dict[str, float]:
    run = Run()
    start = time.perf_counter() + 5.0
    stop = start + duration
    request = _mixed if mixed else _uniform

    async def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.perf_counter() < stop:
            await _one(url, *request(rng), run)

    await asyncio.gather(*(client(i) for i in range(streams)))
    return summary(run, start, stop)


CELLS = {"uniform_c1": (1, False), "uniform_c16": (16, False), "mixed_c16": (16, True), "mixed_c1": (1, True)}


def measure(url: str, duration: float, seed: int, cells: list[str]) -> dict[str, dict[str, float]]:
    figures = {}
    for name in cells:
        streams, mixed = CELLS[name]
        figures[name] = asyncio.run(closed(url, streams, duration, seed, mixed))
        f = figures[name]
        print(
            f"  {name}: {f['output_tokens_per_s']:.1f} tokens/s, TTFT p50/p99 {f['ttft_p50_ms']:.0f}/"
            f"{f['ttft_p99_ms']:.0f} ms, ITL p50/p99 {f['itl_p50_ms']:.1f}/{f['itl_p99_ms']:.1f} ms, "
            f"TPOT p50 {f['tpot_p50_ms']:.1f} ms, done {f['completed']:.0f}, failed {f['failed']:.0f}",
            flush=True,
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--gguf-python", required=True)
    parser.add_argument("--pairs", default="fp32,int8,int4")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--accuracy-level", type=int, default=4)
    parser.add_argument("--no-load", action="store_true", help="only the greedy check and perplexity")
    parser.add_argument("--cells", default=",".join(CELLS), help="of " + ",".join(CELLS))
    parser.add_argument("--out", default="llm_peer.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    pairs = args.pairs.split(",")
    cells = args.cells.split(",")
    result: dict[str, object] = {"machine": machine_stamp(), "accuracy_level": args.accuracy_level}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        weights, held = build(root, args.gguf_python, pairs, args.accuracy_level)
        for index, pair in enumerate(pairs):
            kind = PAIRS[pair][1]
            version = root / f"ort_{pair}" / MODEL / "1"
            entry: dict[str, object] = {"ortserve_perplexity": ort_perplexity(version, weights, held)}
            runs: list[tuple[str, dict[str, dict[str, float]]]] = []
            sides = ("ortserve", "llama.cpp") if args.no_load else ("ortserve", "llama.cpp", "ortserve_again")
            for turn, side in enumerate(sides):
                seed = 100 * index + turn
                print(f"{pair} / {side}", flush=True)
                if side == "llama.cpp":
                    with llama_server(
                        args.llama_server, root / f"{kind}.gguf", root / f"llama_{kind}.log"
                    ) as url:
                        entry["llama_text"] = greedy_text(url)
                        entry["llama_perplexity"] = llama_perplexity(url, held, weights.shape.vocab_size)
                        if not args.no_load:
                            runs.append((side, measure(url, args.duration, seed, cells)))
                    continue
                log = root / f"ortserve_{pair}_{turn}.log"
                extra = ["--intra-op-threads", "1"]
                with run_server(root / f"ort_{pair}", log, extra, pin_cpu=0) as server:
                    entry.setdefault("ortserve_text", greedy_text(server.http_url))
                    if not args.no_load:
                        runs.append((side, measure(server.http_url, args.duration, seed, cells)))
            entry["text_equal"] = entry["ortserve_text"] == entry.get("llama_text")
            entry["runs"] = dict(runs)
            print(
                f"{pair}: text equal {entry['text_equal']}; perplexity ortserve {entry['ortserve_perplexity']:.4f}, "
                f"llama.cpp {entry.get('llama_perplexity', float('nan')):.4f}",
                flush=True,
            )
            if not entry["text_equal"]:
                print(
                    f"  ortserve:  {entry['ortserve_text']!r}\n  llama.cpp: {entry.get('llama_text')!r}",
                    flush=True,
                )
            result[pair] = entry
            OUT.mkdir(exist_ok=True)
            (OUT / args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
