"""``n=4`` against 4 separate requests at 16 streams on the demo LM, with the prompt's prefix warm
in the cache and cold, A/B/A' in every round.

Each round runs, in turn: 4 chat requests with ``n=4`` (A), the same 16 sequences as 16 separate
requests (B), the ``n=4`` requests again (A'), for the warm case (the same prompt every time,
its keys and values in the prefix cache after the warm-up) and the cold one (every request its
own ``cache_salt``, so nothing is found in the cache: ``n=4`` prefills once per request, the
separate requests once each). Figures: the server process's CPU time per generated token (other
work on the machine does not count in it), wall time per token, and prompt tokens prefilled per
request of 4 sequences (from ``ortserve_llm_prompt_tokens_total`` minus cached tokens).
A's figure is the mean of A and A'; a variant's result is the median over rounds of its ratio
to A in the same round.

    .venv/bin/python benchmarks/bench_llm_choices.py --rounds 7 -o /tmp/choices.json
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
from pathlib import Path

import openai

from ortserve.llm.demo import DEMO_LLM_NAME, corpus_documents, write_demo_llm
from ortserve.testing import ServerProcess, run_server


def _cpu_seconds(server: ServerProcess) -> float:
    """The server's CPU time, every thread, in nanoseconds' resolution (``/proc/<pid>/stat``
    counts clock ticks of 10 ms, too coarse for a round of short requests)."""
    total = 0
    for task in Path(f"/proc/{server.process.pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


async def _round(
    client: openai.AsyncOpenAI, prompt: str, tokens: int, n: int, salted: str | None, seed: int
) -> int:
    """16 sequences as 16 / n requests of n choices; returns the tokens generated."""

    async def one(i: int) -> int:
        extra: dict[str, object] = {"ignore_eos": True}
        if salted is not None:
            extra["cache_salt"] = f"{salted}-{seed}-{i}"
        reply = await client.chat.completions.create(
            model=DEMO_LLM_NAME,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens,
            temperature=1.0,
            seed=seed * 100 + i * n,
            n=n,
            extra_body=extra,
        )
        return reply.usage.completion_tokens if reply.usage else 0

    return sum(await asyncio.gather(*(one(i) for i in range(16 // n))))


async def _measure(
    server: ServerProcess, rounds: int, tokens: int, prompt: str
) -> dict[str, dict[str, object]]:
    arms = {"n4": 4, "separate": 1}
    samples: dict[str, dict[str, list[float]]] = {}
    async with openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=300
    ) as client:
        for cache in ("warm", "cold"):
            salted = None if cache == "warm" else cache
            await _round(client, prompt, tokens, 4, salted, 999)  # warm-up (and the warm prefix)
            await _round(client, prompt, tokens, 1, salted, 998)
            for r in range(rounds):
                per_round: dict[str, tuple[float, float]] = {}
                for label, arm in (("n4", "n4"), ("separate", "separate"), ("n4_again", "n4")):
                    cpu_before = _cpu_seconds(server)
                    started = time.perf_counter()
                    generated = await _round(
                        client, prompt, tokens, arms[arm], salted, r * 3 + len(per_round)
                    )
                    wall = time.perf_counter() - started
                    cpu = _cpu_seconds(server) - cpu_before
                    per_round[label] = (cpu / generated * 1e6, wall / generated * 1e6, cpu * 1e3)
                a = [(x + y) / 2 for x, y in zip(per_round["n4"], per_round["n4_again"], strict=True)]
                for arm, figures in (("n4", a), ("separate", per_round["separate"])):
                    row = samples.setdefault(
                        f"{arm}_{cache}",
                        {"cpu": [], "wall": [], "cpu_ratio": [], "wall_ratio": [], "cpu_ms": []},
                    )
                    row["cpu"].append(figures[0])
                    row["wall"].append(figures[1])
                    row["cpu_ratio"].append(figures[0] / a[0])
                    row["wall_ratio"].append(figures[1] / a[1])
                    row["cpu_ms"].append(figures[2])
    return {
        name: {
            "cpu_us_per_token": statistics.median(row["cpu"]),
            "wall_us_per_token": statistics.median(row["wall"]),
            "cpu_ratio_to_n4": statistics.median(row["cpu_ratio"]),
            "wall_ratio_to_n4": statistics.median(row["wall_ratio"]),
            "cpu_ms_per_16_sequences": statistics.median(row["cpu_ms"]),
            "cpu_ratios": row["cpu_ratio"],
        }
        for name, row in samples.items()
    }


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
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of every sequence")
    parser.add_argument("--prompt-words", type=int, default=200, help="words of corpus text in the prompt")
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--load-cpu", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    prompt = " ".join(" ".join(corpus_documents()).split()[: args.prompt_words])
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_llm(root / "models")
        with run_server(
            root / "models", root / "server.log", ["--intra-op-threads", "1"], pin_cpu=args.server_cpu
        ) as server:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {args.load_cpu})
            results = asyncio.run(_measure(server, args.rounds, args.tokens, prompt))
    report = {
        "cpu": _cpu(),
        "load_average": os.getloadavg(),
        "rounds": args.rounds,
        "max_tokens": args.tokens,
        "prompt_words": args.prompt_words,
        "streams": 16,
        "results": results,
    }
    for name, figures in results.items():
        print(f"{name:14s} cpu {figures['cpu_us_per_token']:7.1f} us/token (x{figures['cpu_ratio_to_n4']:.3f}), "
              f"{figures['cpu_ms_per_16_sequences']:6.1f} ms per 16 sequences  "
              f"wall {figures['wall_us_per_token']:7.1f} us/token (x{figures['wall_ratio_to_n4']:.3f})")  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
