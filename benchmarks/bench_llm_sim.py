"""The generation engine's scheduling on a fake clock, with a step cost shaped like the 30.6M
decoder's on one core: mixed lengths, closed loop at 16 streams, then open Poisson loops at
multiples of the closed loop's capacity. No model runs: each decode moves the clock by
``a + b·rows + c·held tokens`` and each prefill chunk by ``p0 + p·tokens``, so a scheduling
change is judged in seconds without the shared machine's noise (the served benchmark,
bench_llm_mixed.py, then says whether it holds on the real model).

Usage: ``python benchmarks/bench_llm_sim.py [--src OTHER/src] [--rates 1.3,2]``; prints JSON.
Costs (defaults measured at warm-up on the AMD EPYC core: one-row step 15.8 ms, a row 2.2 ms,
a 64-token chunk 73 ms) can be changed with ``--costs a,b,c,p0,p``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default=None)
    parser.add_argument("--rates", default="1.3,2")
    parser.add_argument("--duration", type=float, default=300.0, help="virtual seconds per phase")
    parser.add_argument("--warmup", type=float, default=60.0, help="virtual seconds not counted")
    parser.add_argument("--costs", default="0.012,0.0022,0.000001,0.012,0.00095")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-queue-wait", type=float, default=30.0)
    parser.add_argument("--prefill-share", type=float, default=None, help="EngineLimits.prefill_share")
    parser.add_argument("--max-itl-ms", type=float, default=0.0, help="EngineLimits.max_itl_ms (0: measured)")
    parser.add_argument("--seeds", type=int, default=1, help="runs of each phase (medians printed)")
    parser.add_argument(
        "--noise", type=float, default=0.0, help="relative sd of each decode and chunk (a shared core)"
    )
    parser.add_argument(
        "--overhead", type=float, default=0.0, help="seconds per event handed out (untimed by the engine)"
    )
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    import numpy as np

    from ortserve.errors import Overloaded
    from ortserve.llm.demo import train_tokenizer
    from ortserve.llm.engine import EngineLimits, GenerationEngine
    from ortserve.llm.prefix_cache import PrefixCache
    from ortserve.llm.sampler import SamplingParams
    from ortserve.llm.sequence import GenerationEvent, Sequence
    from ortserve.llm.tokenizer import TextTokenizer

    a, b, c, p0, p = (float(x) for x in args.costs.split(","))
    vocab = 50

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    class Backend:
        def __init__(self, clock: Clock, seed: int) -> None:
            self.clock = clock
            self.jitter = random.Random(seed * 7 + 3)
            self.rows: list[Sequence] = []
            self.held: dict[Sequence, int] = {}
            self.decoder = None

        nbytes = 0

        def admit(self, sequence: Sequence, length: int) -> None:
            self.held[sequence] = 0

        def prefill(self, sequence: Sequence, start: int, stop: int, prefix: object) -> object:
            self.clock.now += (p0 + p * (stop - start)) * self.noisy()
            self.held[sequence] = stop
            out = np.zeros(vocab, dtype=np.float32)
            out[3 + stop % (vocab - 3)] = 10.0
            return out

        def activate(self, sequence: Sequence) -> None:
            self.rows.append(sequence)

        def grow(self) -> None:
            return

        def decode(self) -> tuple[list[Sequence], object]:
            held = sum(s.length for s in self.rows)
            self.clock.now += (a + b * len(self.rows) + c * held) * self.noisy()
            out = np.zeros((len(self.rows), vocab), dtype=np.float32)
            out[:, 5] = 10.0
            return list(self.rows), out

        def noisy(self) -> float:
            """A step's factor on a shared core: mostly near 1, now and then longer (a neighbour)."""
            return max(0.5, self.jitter.gauss(1.0, args.noise)) if args.noise else 1.0

        def release(self, sequence: Sequence) -> None:
            self.held.pop(sequence, None)
            if sequence in self.rows:
                self.rows.remove(sequence)

        def read(self, sequence: Sequence, length: int) -> list[object]:
            return []

        def decoding(self) -> list[Sequence]:
            return list(self.rows)

    with tempfile.TemporaryDirectory() as tmp:
        train_tokenizer(["the quick brown fox jumps over the lazy dog"], vocab).save(f"{tmp}/tokenizer.json")
        tokenizer = TextTokenizer(Path(tmp), {})

    def run(mode: str, rate: float, seed: int) -> dict[str, float]:
        clock = Clock()
        backend = Backend(clock, seed)
        stamps: dict[Sequence, list[float]] = {}
        arrival: dict[Sequence, float] = {}

        def sink(events: list[tuple[Sequence, GenerationEvent]]) -> None:
            clock.now += args.overhead * len(events)
            for sequence, event in events:
                if event.token_ids:
                    stamps.setdefault(sequence, []).extend([clock.now] * len(event.token_ids))

        extra: dict[str, float] = {} if args.prefill_share is None else {"prefill_share": args.prefill_share}
        if args.max_itl_ms:
            extra["max_itl_ms"] = args.max_itl_ms
        limits = EngineLimits(max_num_seqs=64, max_waiting=256, max_context_len=4096,
                              max_queue_wait_s=args.max_queue_wait, **extra)  # type: ignore[arg-type]  # fmt: skip
        engine = GenerationEngine(backend.decoder, limits, PrefixCache(0, 1.0, clock), sink, clock, backend)  # type: ignore[arg-type]
        if "chunk_fixed_s" in inspect.signature(engine.tune).parameters:
            engine.tune(a + b + c * 300, p, b, chunk_fixed_s=p0)  # as warm-up measures them now
        else:
            engine.tune(a + b + c * 300, p + p0 / 64, b)  # a 64-token prefill, per token
        engine.timeline = []
        rng = random.Random(seed)
        refused = 0
        done: list[Sequence] = []

        def new() -> Sequence | None:
            nonlocal refused
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(16, 512))]
            params = SamplingParams(max_tokens=rng.randint(16, 256), temperature=0.0, ignore_eos=True)
            sequence = Sequence(prompt, params, tokenizer, (), 4096)
            try:
                engine.submit(sequence)
            except Overloaded:
                refused += 1
                return None
            arrival[sequence] = clock.now
            done.append(sequence)
            return sequence

        end = args.warmup + args.duration
        live: list[Sequence] = []
        next_at = 0.0
        if mode == "closed":
            live = [s for s in (new() for _ in range(args.streams)) if s is not None]
        while clock.now < end:
            if mode == "closed":
                for sequence in [s for s in live if s.finish_reason is not None]:
                    live.remove(sequence)
                    more = new()
                    if more is not None:
                        live.append(more)
            else:
                while next_at <= clock.now:
                    new()
                    next_at += rng.expovariate(rate)
            if engine.idle():
                clock.now = next_at if mode == "open" else clock.now + 0.001
                continue
            engine.step()
        drained_at = clock.now
        while not engine.idle() and clock.now < drained_at + 600:
            engine.step()
        start, stop = args.warmup, end
        tokens = sum(1 for s in done for t in stamps.get(s, []) if start <= t <= stop)
        ttft = sorted(stamps[s][0] - arrival[s] for s in done if s in stamps and start <= arrival[s] <= stop)
        gaps = sorted(
            y - x
            for s in done
            for x, y in zip(stamps.get(s, []), stamps.get(s, [])[1:])
            if start <= y <= stop
        )

        def pct(values: list[float], q: float) -> float:
            return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0

        return {
            "output_tokens_per_s": tokens / (stop - start),
            "ttft_p50_ms": 1e3 * pct(ttft, 0.5), "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
            "itl_p50_ms": 1e3 * pct(gaps, 0.5), "itl_p99_ms": 1e3 * pct(gaps, 0.99),
            "itl_ratio": pct(gaps, 0.99) / max(pct(gaps, 0.5), 1e-9),
            "itl_target_ms": 1e3 * engine.itl_target_s(),
            "itl_over_target": sum(g > engine.itl_target_s() for g in gaps) / max(len(gaps), 1),
            "rows_p50": statistics.median([t[2] for t in engine.timeline if start <= t[0] <= stop and t[2]] or [0]),
            "preemptions": float(engine.preemptions),
            "refused": float(refused), "admitted": float(len(done)),
            "unfinished": float(sum(1 for s in done if s.finish_reason is None)),
            "requests_per_s": sum(1 for s in done if s in stamps and start <= stamps[s][-1] <= stop) / (stop - start),
        }  # fmt: skip

    def median(runs: list[dict[str, float]]) -> dict[str, float]:
        return {name: statistics.median(r[name] for r in runs) for name in runs[0]}

    seeds = range(args.seeds)
    closed_runs = [run("closed", 0.0, 1 + 10 * k) for k in seeds]
    closed = median(closed_runs)
    result = {"closed": closed}
    for multiple in (float(x) for x in args.rates.split(",")):
        runs = []
        for k, one in zip(seeds, closed_runs, strict=True):  # each seed's open loop against its closed
            opened = run("open", multiple * one["requests_per_s"], 2 + 10 * k)
            opened["of_closed"] = opened["output_tokens_per_s"] / one["output_tokens_per_s"]
            runs.append(opened)
        result[f"open_x{multiple}"] = median(runs)
    if args.seeds > 1:
        result["closed_ttft_p99_ms_each"] = {
            str(k): r["ttft_p99_ms"] for k, r in zip(seeds, closed_runs, strict=True)
        }
    print(json.dumps({k: {n: round(v, 2) for n, v in r.items()} for k, r in result.items()}, indent=1))


if __name__ == "__main__":
    main()
