"""Per-token cost of the LLM API features at 16 streams on the demo LM: logprobs, structured
output (json_schema), n=4 against 4 separate requests each, and tool_choice=required.

The server is pinned to one CPU and this load to another. Each round runs every variant once,
in turn (so drift hits them alike); a variant's figure is the median over rounds of its
wall-clock time per generated token, and of the engine's own step time per token read from
/metrics (no HTTP in it). Ratios are to the plain variant measured in the same rounds.

    .venv/bin/python benchmarks/bench_llm_api.py --rounds 7 -o /tmp/llm_api.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

from ortserve.llm.demo import DEMO_LLM_NAME, corpus_documents, write_demo_llm
from ortserve.llm.structured import grammar_for, grammars_of
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.testing import ServerProcess, run_server

_PROMPT = "The lighthouse stood at the end of the long stone pier, and every evening the keeper"
_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 6}},
        "required": ["word"],
    },
    "minItems": 40,
    "maxItems": 40,
}
_TOOL = {
    "type": "function",
    "function": {
        "name": "log_words",
        "parameters": {
            "type": "object",
            "properties": {
                "words": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 40}
            },
            "required": ["words"],
        },
    },
}


def _variants(tokens: int, prompt: str) -> dict[str, tuple[int, dict[str, object]]]:
    """name -> (concurrent requests, request fields); each variant runs 16 sequences."""
    base: dict[str, object] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                               "temperature": 1.0, "ignore_eos": True}  # fmt: skip
    json_schema = {"type": "json_schema", "json_schema": {"name": "words", "schema": _SCHEMA}}
    return {
        "plain": (16, base),
        "logprobs": (16, {**base, "logprobs": True, "top_logprobs": 5}),
        "json_schema": (16, {**base, "response_format": json_schema}),
        "tools_required": (16, {**base, "tools": [_TOOL], "tool_choice": "required"}),
        "n4": (4, {**base, "n": 4}),
        # 16 separate requests that cannot share the prompt's prefill (a salt each): what n=4
        # saves when its 4 choices' prefill is shared
        "separate_unshared": (16, {**base, "cache_salt": "each"}),
    }


def _long_prompt(words: int) -> str:
    text = " ".join(corpus_documents()).split()
    return " ".join(text[:words]) if words else _PROMPT


def _cpu_seconds(server: ServerProcess) -> float:
    """The server process's user + system CPU time (other helpers' load on the machine does
    not count in it, where it does in wall time)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{DEMO_LLM_NAME}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _round(client: openai.AsyncOpenAI, requests: int, fields: dict[str, object], seed: int) -> int:
    async def one(i: int) -> int:
        extra = {k: v for k, v in fields.items() if k not in ("messages", "max_tokens")}
        if "cache_salt" in extra:
            extra["cache_salt"] = f"{seed}-{i}"
        reply = await client.chat.completions.create(
            model=DEMO_LLM_NAME,
            messages=fields["messages"],
            max_tokens=int(fields["max_tokens"]),  # type: ignore[call-overload]
            seed=seed * 100 + i,
            extra_body=extra,
        )
        return reply.usage.completion_tokens if reply.usage else 0

    return sum(await asyncio.gather(*(one(i) for i in range(requests))))


async def _measure(
    server: ServerProcess, rounds: int, tokens: int, prompt: str
) -> dict[str, dict[str, float]]:
    variants = _variants(tokens, prompt)
    samples: dict[str, dict[str, list[float]]] = {n: {"wall": [], "engine": [], "cpu": []} for n in variants}
    async with openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=120
    ) as client:
        for requests, fields in variants.values():  # warm-up: grammar tokenizer, caches
            await _round(client, requests, fields, 999)
        for r in range(rounds):
            for name, (requests, fields) in variants.items():
                steps_before = _metric(server, "ortserve_llm_engine_step_seconds_total")
                cpu_before = _cpu_seconds(server)
                started = time.perf_counter()
                generated = await _round(client, requests, fields, r)
                elapsed = time.perf_counter() - started
                cpu = _cpu_seconds(server) - cpu_before
                step_time = _metric(server, "ortserve_llm_engine_step_seconds_total") - steps_before
                samples[name]["wall"].append(elapsed / generated * 1e6)
                samples[name]["engine"].append(step_time / generated * 1e6)
                samples[name]["cpu"].append(cpu / generated * 1e6)
    result: dict[str, dict[str, float]] = {}
    for name, kinds in samples.items():
        result[name] = {}
        for kind, values in kinds.items():
            plain = samples["plain"][kind]
            result[name][f"{kind}_us_per_token"] = statistics.median(values)
            result[name][f"{kind}_ratio"] = statistics.median(
                v / p for v, p in zip(values, plain, strict=True)
            )
    return result


def _mask_cost(models: Path, steps: int) -> float:
    """Microseconds per token of the json_schema mask alone (compute + apply + advance), 16 matchers
    stepped together as the engine steps its rows."""
    folder = models / DEMO_LLM_NAME / "1"
    tokenizer = TextTokenizer(folder, json.loads((folder / "tokenizer_config.json").read_text()))
    eos = tokenizer.token_id("<|endoftext|>")
    grammar = grammar_for({"type": "json_schema", "json_schema": {"name": "words", "schema": _SCHEMA}})
    assert grammar is not None and eos is not None
    make = grammars_of(tokenizer, (eos,)).constraint(grammar)
    constraints = [make() for _ in range(16)]
    rng = np.random.default_rng(0)
    scores = rng.normal(0, 1, (16, tokenizer.vocab_size)).astype(np.float32)
    started = time.perf_counter()
    for _ in range(steps):
        for row, constraint in enumerate(constraints):
            allowed = constraint.allowed(tokenizer.vocab_size)
            masked = np.where(allowed, scores[row], -np.inf)
            constraint.advance(int(np.argmax(masked)))
    return (time.perf_counter() - started) / (steps * 16) * 1e6


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), ""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=48, help="max_tokens of every sequence")
    parser.add_argument("--prompt-words", type=int, default=200, help="words of corpus text in the prompt")
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--load-cpu", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_llm(root / "models")
        mask_us = _mask_cost(root / "models", args.tokens)
        with run_server(
            root / "models", root / "server.log", ["--intra-op-threads", "1"], pin_cpu=args.server_cpu
        ) as server:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {args.load_cpu})
            prompt = _long_prompt(args.prompt_words)
            results = asyncio.run(_measure(server, args.rounds, args.tokens, prompt))
    report = {
        "cpu": _cpu(),
        "rounds": args.rounds,
        "json_mask_us_per_token": mask_us,
        "prompt_words": args.prompt_words,
        "max_tokens": args.tokens,
        "streams": 16,
        "variants": results,
    }
    for name, figures in results.items():
        print(f"{name:18s}", "   ".join(f"{kind} {figures[kind + '_us_per_token']:7.1f} us/token "
                                          f"(x{figures[kind + '_ratio']:.3f})" for kind in ("cpu", "engine", "wall")))  # fmt: skip
    print(f"json_schema mask alone: {mask_us:.1f} us/token (16 matchers, {args.tokens} steps)")
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
