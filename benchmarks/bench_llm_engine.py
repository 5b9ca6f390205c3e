"""The generation engine alone, in process (no HTTP, no client process): mixed lengths, closed
loop at 16 streams, then an open Poisson loop at a multiple of the closed loop's request rate.

Meant to be run once per build, interleaved (``--src`` puts another checkout's ``src`` first on
the path: an older engine from ``git worktree add``), pinned to one core, so that the shared
machine's noise from the HTTP client and server loop is out of the comparison.

Usage: ``python benchmarks/bench_llm_engine.py --folder DIR [--src OLD/src] [--duration 20]``,
where DIR is a version folder written by ``bench_llm_mixed.build`` (``--build DIR`` writes both
layouts there). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _timeline(
    steps: list[tuple[float, float, int, int, int, int]], start: float, stop: float
) -> dict[str, float]:
    """Where the engine thread's time went in [start, stop]: busy share, rows per step, steps
    that decoded nothing, prefill tokens per step, the queue beside the running set."""
    inside = [s for s in steps if start <= s[0] <= stop]
    if not inside:
        return {}
    busy = sum(s[1] for s in inside)
    # The machine's own noise: decode-only steps of the median width, one and the same work.
    width = _pct([s[2] for s in inside], 0.5)
    plain = [s[1] for s in inside if s[3] == 0 and s[2] == width]
    return {
        "plain_steps": float(len(plain)),
        "plain_step_p99_over_p50": _pct(plain, 0.99) / max(_pct(plain, 0.5), 1e-9),
        "steps": float(len(inside)),
        "busy_share": busy / (stop - start),
        "rows_median": float(_pct([s[2] for s in inside], 0.5)),
        "rows_mean_weighted": sum(s[2] * s[1] for s in inside) / busy,
        "steps_no_decode": float(sum(1 for s in inside if s[2] == 0)),
        "prefill_tokens_per_s": sum(s[3] for s in inside) / (stop - start),
        "steps_with_prefill": float(sum(1 for s in inside if s[3])),
        "waiting_median": float(_pct([s[4] for s in inside], 0.5)),
        "step_ms_p50": 1e3 * _pct([s[1] for s in inside], 0.5),
        "step_ms_p99": 1e3 * _pct([s[1] for s in inside], 0.99),
    }


async def _run(
    folder: Path, duration: float, open_rate: float, streams: int, warmup: float = 0.0
) -> dict[str, object]:
    from ortserve.config.model import ModelConfig
    from ortserve.llm.loader import load_llm_version
    from ortserve.llm.servable import sampling_from
    from ortserve.settings import ServerSettings

    config = ModelConfig.model_validate(
        {"kind": "llm", "intra_op_threads": 1, "llm": {"max_num_seqs": 64, "max_waiting": 256}}
    )
    served = await load_llm_version(
        "m", 1, folder / "model.onnx", config, ServerSettings(model_repository=folder.parent)
    )
    rng = random.Random(0)
    errors: dict[str, int] = {}
    steps: list[tuple[float, float, int, int, int, int]] = []
    if hasattr(served.engine, "timeline"):
        served.engine.timeline = steps

    async def one(traces: list[tuple[float, float | None, list[float], int]]) -> None:
        prompt = [rng.randrange(3, 256) for _ in range(rng.randint(16, 512))]
        params = sampling_from({"max_tokens": rng.randint(16, 256), "temperature": 0, "ignore_eos": True}, 16)
        started, first, stamps, tokens = time.perf_counter(), None, [], 0
        try:
            async for event in served.generate(prompt, params).events():
                now = time.perf_counter()
                if event.token_ids:
                    first = first or now
                    stamps.append(now)
                    tokens += len(event.token_ids)
        except Exception as exc:  # a refusal (429) or an error: counted as no tokens
            kind = type(exc).__name__
            errors[kind] = errors.get(kind, 0) + 1
            await asyncio.sleep(0.05)  # a refused closed-loop client must not spin
        traces.append((started, first, stamps, tokens))

    def summary(
        traces: list[tuple[float, float | None, list[float], int]], start: float, stop: float
    ) -> dict[str, float]:
        window = sum(1 for _, _, stamps, _ in traces for t in stamps if start <= t <= stop)
        ttft = [f - s for s, f, _, _ in traces if f is not None and start <= s <= stop]
        gaps = [b - a for _, _, st, _ in traces for a, b in itertools.pairwise(st) if start <= b <= stop]
        return {
            "output_tokens_per_s": window / (stop - start),
            "ttft_p50_ms": 1e3 * _pct(ttft, 0.5), "ttft_p99_ms": 1e3 * _pct(ttft, 0.99),
            "itl_p50_ms": 1e3 * _pct(gaps, 0.5), "itl_p99_ms": 1e3 * _pct(gaps, 0.99),
            "requests": float(len(traces)), "no_tokens": float(sum(1 for t in traces if t[1] is None)),
        }  # fmt: skip

    engine = served.engine

    def model_share(before: tuple[float, float]) -> dict[str, float]:
        """ONNX Runtime's share of the engine's step time since ``before`` (the rest is the
        engine's Python: admission, sampling, events)."""
        spent = engine.step_seconds - before[0]
        return {"model_share_of_steps": (engine.decoder.run_seconds - before[1]) / max(spent, 1e-9)}

    closed: list[tuple[float, float | None, list[float], int]] = []
    mark = (engine.step_seconds, engine.decoder.run_seconds)
    start = time.perf_counter() + 3.0
    stop = start + duration

    async def client() -> None:
        while time.perf_counter() < stop:
            await one(closed)

    await asyncio.gather(*(client() for _ in range(streams)))
    result: dict[str, object] = {
        "closed": summary(closed, start, stop)
        | _timeline(steps, start, stop)
        | model_share(mark)
        | {"errors": dict(errors)}
    }
    errors.clear()
    mark = (engine.step_seconds, engine.decoder.run_seconds)
    # Capacity in requests/s: the closed loop's output tokens/s over the mean output (136 tokens).
    rate = open_rate * max(float(result["closed"]["output_tokens_per_s"]) / 136.0, 0.05)  # type: ignore[index]
    opened: list[tuple[float, float | None, list[float], int]] = []
    start = time.perf_counter()
    stop = start + duration
    tasks, at = [], start
    while at < stop:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(opened)))
        at += rng.expovariate(rate)
    _, pending = await asyncio.wait(tasks, timeout=60.0)
    # Counted from ``warmup`` s after the first arrival: the closed loop is counted from 3 s
    # after its start too (a queue needs time to build at a rate only a little above capacity).
    result["open"] = (
        summary(opened, start + warmup, stop)
        | _timeline(steps, start + warmup, stop)
        | {"rate": rate, "unfinished": float(len(pending)), "errors": dict(errors)}
        | model_share(mark)
    )
    for task in pending:
        task.cancel()
    await served.unload(1.0)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--build", type=Path, default=None)
    parser.add_argument("--src", default=None)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--open-rate", type=float, default=1.3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=0.0, help="open loop: seconds not counted")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    if args.build is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_llm_mixed import build

        build(args.build, {"optimum", "genai"})
        return
    os.sched_setaffinity(0, {0})
    print(
        json.dumps(asyncio.run(_run(args.folder, args.duration, args.open_rate, args.streams, args.warmup))),
        flush=True,
    )


if __name__ == "__main__":
    main()
