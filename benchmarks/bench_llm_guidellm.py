"""``ortserve bench --transport openai`` against an independent client, guidellm, on one server.

One ortserve server (bench_llm_peers.py's ~30M decoder, pinned to CPU 0, one ONNX Runtime
thread) answers both clients in turn, alternating ``--rounds`` times: guidellm (its own
virtualenv, offline, the version folder as its tokenizer; synthetic text prompts of 128
tokens by its tokenizer, 128 output tokens, which it asks with ``ignore_eos``) and then
``ortserve bench`` with token-id prompts as long as the server counted guidellm's prompts (the
median of the prompt tokens the server's usage reported), both at the same concurrency on
CPU 1 for the same window. Compared: output tokens/s, requests/s, time to first token
(mean, median), inter-token latency (median). Every round of either client draws new prompts
(its own seed), so neither replays the other's into the prefix cache. guidellm never enters the
test suite.

Usage: ``python benchmarks/bench_llm_guidellm.py [--concurrency 16] [--seconds 45] [--rounds 2]``;
writes benchmarks/out/llm_guidellm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_peers import MODEL, build_checkpoints
from machine import stamp as machine_stamp

from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"


def guidellm_round(
    python: Path, url: str, tokenizer: Path, concurrency: int, seconds: float, out: Path, seed: int
) -> dict[str, float]:
    backend = f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions,http2=false,validate_backend=false"
    args = [
        "taskset", "-c", "1", str(python.parent / "guidellm"), "run", "--backend", backend,
        "--profile", f"kind=concurrent,streams={concurrency}",
        "--constraint", f"kind=max_duration,seconds={seconds:g}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--data", "kind=synthetic_text,prompt_tokens=128,output_tokens=128",
        "--output", f"kind=json,path={out}", "--disable-console-interactive",
        "--seed", f"kind=static,value={seed}",
    ]  # fmt: skip
    subprocess.run(args, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]

    def stat(name: str, key: str, group: str = "successful") -> float:
        return float(metrics[name][group][key])

    return {
        "output_tokens_per_s": stat("output_tokens_per_second", "mean"),
        "output_tokens_per_s_all": stat("output_tokens_per_second", "mean", "total"),
        "requests_per_s": stat("requests_per_second", "mean"),
        "ttft_mean_s": stat("time_to_first_token_ms", "mean") / 1e3,
        "ttft_p50_s": stat("time_to_first_token_ms", "median") / 1e3,
        "itl_p50_s": stat("inter_token_latency_ms", "median") / 1e3,
        "itl_mean_s": stat("inter_token_latency_ms", "mean") / 1e3,
        "prompt_tokens_p50": stat("prompt_token_count", "median"),
        "output_tokens_p50": stat("output_token_count", "median"),
        "requests": stat("request_latency", "count"),
    }


def ortserve_round(
    url: str, prompt: int, concurrency: int, seconds: float, out: Path, seed: int
) -> dict[str, float]:
    args = [
        "taskset", "-c", "1", sys.executable, "-m", "ortserve", "bench", url, "--transport", "openai",
        "-m", MODEL, "-c", str(concurrency), "-d", f"{seconds:g}", "--warmup", "3",
        "--prompt-tokens", str(prompt), "--max-tokens", "128", "--seed", str(seed), "-o", str(out),
    ]  # fmt: skip
    subprocess.run(args, check=True, capture_output=True)
    level = json.loads(out.read_text())["levels"][0]
    return {
        "output_tokens_per_s": level["output_tokens_per_s"],
        "requests_per_s": level["requests_per_s"],
        "ttft_mean_s": level["ttft_s"]["mean"],
        "ttft_p50_s": level["ttft_s"]["p50"],
        "itl_p50_s": level["itl_s"]["p50"],
        "itl_mean_s": level["itl_s"]["mean"],
        "failures": level["failures"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--guidellm-python", type=Path, default=Path("/work/venvs/guidellm/bin/python"))
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    work = OUT / "llm_peers"
    models, _ = build_checkpoints(work)
    tokenizer = (models / MODEL / "1").resolve()
    load_before = os.getloadavg()
    rounds: list[dict[str, dict[str, float]]] = []
    with run_server(models, work / "guidellm_server.log", ["--intra-op-threads", "1"], pin_cpu=0) as server:
        for index in range(args.rounds):
            theirs = guidellm_round(args.guidellm_python, server.http_url, tokenizer, args.concurrency,
                                    args.seconds, work / f"guidellm_{index}.json", index + 1)  # fmt: skip
            prompt = round(theirs["prompt_tokens_p50"]) or 128  # 0: no request of guidellm's finished
            ours = ortserve_round(
                server.http_url,
                prompt,
                args.concurrency,
                args.seconds,
                work / f"ours_{index}.json",
                index + 1,
            )
            rounds.append({"guidellm": theirs, "ortserve_bench": ours})
            print(
                f"round {index}: guidellm {json.dumps(theirs)}\n  ortserve bench {json.dumps(ours)}",
                flush=True,
            )
    ratios = {
        key: statistics.median(r["ortserve_bench"][key] for r in rounds)
        / (statistics.median(r["guidellm"][key] for r in rounds) or float("nan"))
        for key in (
            "output_tokens_per_s",
            "requests_per_s",
            "ttft_mean_s",
            "ttft_p50_s",
            "itl_p50_s",
            "itl_mean_s",
        )
    }
    print(
        "ortserve bench / guidellm (medians of rounds):",
        json.dumps({k: round(v, 3) for k, v in ratios.items()}),
    )
    document = {
        "machine": machine_stamp(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "rounds": rounds,
        "ratios": ratios,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    (OUT / "llm_guidellm.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
