"""onnxruntime-genai's generation loop on an Optimum-layout model (run with genai's own Python).

onnxruntime-genai has no server and batches statically on CPU: a batch of B prompts of the same
length is prefilled together and decoded until every row is done. This measures, per batch size,
output tokens/s over whole batches (prefill included, as a client would see it) and the time to
the first token (prefill plus one step). ``min_length`` = ``max_length`` keeps EOS from ending
rows early, as ``ignore_eos`` does for the servers.

Usage: ``python genai_llm_loop.py MODEL_DIR --batches 1,4,16 --prompt 128 --steps 128 --rounds 3``;
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime_genai as og


def one_batch(
    model: og.Model, batch: int, prompt: int, steps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(seconds for the whole batch, seconds to the first generated token)."""
    ids = rng.integers(3, 256, (batch, prompt)).astype(np.int32)
    started = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=prompt + steps, min_length=prompt + steps, batch_size=batch, do_sample=False
    )
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    generator.generate_next_token()
    first = time.perf_counter() - started
    produced = 1
    while not generator.is_done():
        generator.generate_next_token()
        produced += 1
    if produced != steps:
        raise RuntimeError(f"expected {steps} tokens per row, generated {produced}")
    return time.perf_counter() - started, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = og.Model(args.model)
    rng = np.random.default_rng(0)
    one_batch(model, 1, 8, 2, rng)  # warm-up
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        runs = [one_batch(model, batch, args.prompt, args.steps, rng) for _ in range(args.rounds)]
        seconds = sorted(r[0] for r in runs)[len(runs) // 2]
        results.append(
            {
                "batch": batch,
                "runs_s": [r[0] for r in runs],
                "ttft_s": sorted(r[1] for r in runs)[len(runs) // 2],
                "output_tokens_per_s": batch * args.steps / seconds,
            }
        )
    print(
        json.dumps(
            {"onnxruntime_genai": og.__version__ if hasattr(og, "__version__") else "?", "levels": results}
        )
    )


if __name__ == "__main__":
    main()
