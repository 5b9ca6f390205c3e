"""OpenAI streamed completions at 16 streams, one server tree against another, alternated.

The model and the load are ``bench_llm.py``'s (a ~30M-parameter decoder, 128-token prompts,
128 output tokens, streamed ``/v1/completions``; server pinned to CPU 0 with one ONNX Runtime
thread, this load on CPU 1). Each round starts one server per tree in turn (``PYTHONPATH`` puts
that tree's ``src`` first) and measures one 16-stream window, so drift hits the trees alike;
a tree listed twice under two labels is the A/A.

    .venv/bin/python benchmarks/bench_edge_llm.py --tree before=/tmp/a/src --tree after=src \\
        --tree before2=/tmp/a/src --rounds 3 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import build_model

from ortserve.loadtest.llm_load import LlmRequestSpec, run_llm_level
from ortserve.testing import run_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a src/ folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=16)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    trees = [item.split("=", 1) for item in args.tree]
    found: dict[str, list[float]] = {label: [] for label, _ in trees}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        build_model(root / "llm30m", 64)
        spec = LlmRequestSpec("llm30m", 128, 128)
        for round_number in range(args.rounds):
            for label, src in trees:
                env = {"PYTHONPATH": str(Path(src).resolve())}
                log = Path(tmp) / f"{label}-{round_number}.log"
                with run_server(root, log, ["--intra-op-threads", "1"], env=env, pin_cpu=0) as server:
                    level = asyncio.run(
                        run_llm_level(server.http_url, spec, args.streams, args.duration, 3.0)
                    )
                found[label].append(level.tokens_per_s)
                print(f"round {round_number} {label}: {level.tokens_per_s:.1f} tokens/s "
                      f"({level.requests} requests, {level.failures} failed)", flush=True)  # fmt: skip
    summary = {label: round(statistics.median(values), 1) for label, values in found.items()}
    print(json.dumps({"median_tokens_per_s": summary, "runs": found, "load_before": load_before,
                      "load_after": os.getloadavg()}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
