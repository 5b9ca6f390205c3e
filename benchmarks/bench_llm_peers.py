"""ortserve against vLLM's CPU build and onnxruntime-genai on the same weights, one core each.

The ~30M-parameter decoder of bench_llm.py (seed 0) is written three ways by llm_checkpoint.py:
the Optimum-layout ONNX folder (ortserve), the same folder with a genai_config.json
(onnxruntime-genai) and a Hugging Face folder with model.safetensors (vLLM). Servers run pinned
to CPU 0 (ortserve with one ONNX Runtime thread; vLLM with ``VLLM_CPU_OMP_THREADS_BIND=0``), this
client on CPU 1, the same streamed /v1/completions load as bench_llm.py: token-id prompts of
128 tokens, 128 output tokens (``ignore_eos``), greedy, closed loop at each concurrency.
ortserve is measured before and after the peer (A B A), so drift on the shared machine shows.
onnxruntime-genai has no server: its static-batch loop runs in-process on CPU 0 at batch sizes
1 / 4 / 16 (whole batches, prefill included), its best batch size is the figure compared.

vLLM and onnxruntime-genai live in their own virtualenvs (``--vllm-python``,
``--genai-python``), never in ortserve's environment or its tests.

Usage: ``python benchmarks/bench_llm_peers.py --peer vllm|genai [--duration 30]``;
writes benchmarks/out/llm_peers_<peer>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import CONFIG, SHAPE
from llm_checkpoint import write_genai_config, write_hf_checkpoint
from machine import stamp as machine_stamp

from ortserve.llm.demo import corpus_documents, train_tokenizer, write_llm_version
from ortserve.llm.weights import DecoderShape, random_weights
from ortserve.loadtest.llm_load import LlmLevel, LlmRequestSpec, run_llm_level
from ortserve.testing import free_port, run_server

OUT = Path(__file__).parent / "out"
MODEL = "llm30m"
PROBE = [5 + (i * 37) % 250 for i in range(64)]


def build_checkpoints(root: Path) -> tuple[Path, Path]:
    """(the ortserve repository, the Hugging Face folder), the same weights in both."""
    tokenizer = train_tokenizer(corpus_documents(), 400)
    shape = DecoderShape(tokenizer.get_vocab_size(), **SHAPE)  # type: ignore[arg-type]
    weights = random_weights(shape, seed=0)
    version = root / "models" / MODEL / "1"
    write_llm_version(version, weights, tokenizer)
    (root / "models" / MODEL / "config.yaml").write_text(CONFIG)
    write_genai_config(version, weights)
    write_hf_checkpoint(version, weights, root / "hf")
    print(f"model: {shape.parameters() / 1e6:.1f}M parameters", flush=True)
    return root / "models", root / "hf"


def probe(url: str) -> str:
    """The greedy text of a fixed prompt (the same weights give the same text)."""
    body = json.dumps(
        {"model": MODEL, "prompt": PROBE, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    )
    request = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return str(json.load(answer)["choices"][0]["text"])


def levels(url: str, concurrencies: list[int], duration: float) -> list[LlmLevel]:
    spec = LlmRequestSpec(MODEL, 128, 128)
    found = []
    for concurrency in concurrencies:
        level = asyncio.run(run_llm_level(url, spec, concurrency, duration, 3.0))
        found.append(level)
        print(
            f"  c={concurrency}: {level.tokens_per_s:.1f} tokens/s, {level.requests} requests, "
            f"{level.failures} failed, TTFT p50 {level.ttft_s.get('p50', 0) * 1e3:.0f} ms, "
            f"mean {level.ttft_s.get('mean', 0) * 1e3:.0f} ms, ITL p50 {level.itl_s.get('p50', 0) * 1e3:.1f} ms",
            flush=True,
        )
    return found


@contextmanager
def vllm_server(python: str, hf: Path, log: Path, pids: list[int] | None = None) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "HF_HUB_OFFLINE": "1",
    }
    args = [
        "taskset", "-c", "0", python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(hf), "--served-model-name", MODEL, "--dtype", "float32",
        "--max-model-len", "2048", "--port", str(port),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        if pids is not None:
            pids.append(process.pid)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 900
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"vLLM exited with {process.returncode}; see {log}")
                try:
                    with urllib.request.urlopen(url + "/v1/models", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def ortserve_round(models: Path, log: Path, concurrencies: list[int], duration: float) -> dict[str, object]:
    with run_server(models, log, ["--intra-op-threads", "1"], pin_cpu=0) as server:
        text = probe(server.http_url)
        found = levels(server.http_url, concurrencies, duration)
    return {"probe": text, "levels": [lv.as_dict() for lv in found]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", choices=["vllm", "genai"], required=True)
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    parser.add_argument("--genai-python", default="/work/venvs/genai/bin/python")
    parser.add_argument("--genai-rounds", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    work = OUT / "llm_peers"
    models, hf = build_checkpoints(work)
    concurrencies = [int(c) for c in args.levels.split(",")]
    document: dict[str, object] = {"machine": machine_stamp(), "model": SHAPE, "load_before": os.getloadavg()}
    print("ortserve (A)", flush=True)
    document["ortserve_before"] = ortserve_round(models, work / "ortserve.log", concurrencies, args.duration)
    if args.peer == "vllm":
        print("vLLM", flush=True)
        with vllm_server(args.vllm_python, hf, work / "vllm.log") as url:
            text = probe(url)
            found = levels(url, concurrencies, args.duration)
        document["vllm"] = {"probe": text, "levels": [lv.as_dict() for lv in found]}
    else:
        print("onnxruntime-genai", flush=True)
        result = subprocess.run(
            ["taskset", "-c", "0", args.genai_python, str(Path(__file__).parent / "genai_llm_loop.py"),
             str(models / MODEL / "1"), "--batches", args.levels, "--rounds", str(args.genai_rounds)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        document["genai"] = json.loads(result.stdout.strip().splitlines()[-1])
        for row in document["genai"]["levels"]:  # type: ignore[index]
            print(
                f"  batch {row['batch']}: {row['output_tokens_per_s']:.1f} tokens/s, TTFT {row['ttft_s'] * 1e3:.0f} ms"
            )
    print("ortserve (A again)", flush=True)
    document["ortserve_after"] = ortserve_round(models, work / "ortserve2.log", concurrencies, args.duration)
    document["load_after"] = os.getloadavg()
    print(f"load average before {document['load_before']}, after {document['load_after']}")
    (OUT / f"llm_peers_{args.peer}.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
