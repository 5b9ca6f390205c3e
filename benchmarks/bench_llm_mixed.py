"""Mixed-length generation traffic on one core: closed loop at 16 streams, then an open Poisson
loop at a multiple of the closed loop's request rate, for one or more server builds side by side.

Model: bench_llm.py's ~30M decoder (random weights), written in two layouts from the same
weights: ``optimum`` (Concat past/present; padded batch) and ``genai`` (GroupQueryAttention with
a shared buffer; the in-place KV pool). Prompts of 16-512 tokens, outputs of 16-256 tokens
(uniform, seeded, ``ignore_eos``). Server pinned to CPU 0 with one ONNX Runtime thread, this
client on CPU 1.

A variant is ``name=layout[:src]``: ``src`` is another checkout's ``src`` folder (an older
engine from ``git worktree add``), put first on the server's PYTHONPATH.

Usage: ``python benchmarks/bench_llm_mixed.py --variants old=optimum:/tmp/engine_old/src,new=genai
[--duration 40] [--open-rate 1.3]``; writes benchmarks/out/llm_mixed.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.llm.demo import corpus_documents, train_tokenizer, write_llm_version
from ortserve.llm.weights import DecoderShape, random_weights
from ortserve.loadtest.llm_load import LlmRequestSpec, StreamTrace, _body, _Connection
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
SHAPE = dict(hidden_size=512, num_hidden_layers=10, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1536)  # fmt: skip
CONFIG = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 64\n  max_waiting: 256\n"


def build(root: Path, layouts: set[str]) -> None:
    tokenizer = train_tokenizer(corpus_documents(), 400)
    shape = DecoderShape(tokenizer.get_vocab_size(), **SHAPE)
    weights = random_weights(shape, seed=0)
    for layout in layouts:
        folder = root / layout / "llm30m"
        write_llm_version(folder / "1", weights, tokenizer, layout=layout)
        (folder / "config.yaml").write_text(CONFIG)


@dataclass
class Run:
    traces: list[StreamTrace] = field(default_factory=list)
    refused: int = 0


def _request(rng: random.Random) -> tuple[list[int], int]:
    prompt = [rng.randrange(3, 256) for _ in range(rng.randint(16, 512))]
    return prompt, rng.randint(16, 256)


async def _one(url: str, prompt: list[int], max_tokens: int, run: Run) -> None:
    parts = urlsplit(url)
    connection = _Connection(parts.hostname or "127.0.0.1", parts.port or 80)
    trace = StreamTrace(time.perf_counter())
    try:
        await connection.post_stream(
            "/v1/completions", _body(LlmRequestSpec("llm30m", 0, max_tokens), prompt), trace
        )
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        trace.status = 0
    finally:
        connection.close()
    trace.ended = time.perf_counter()
    if trace.status == 429:
        run.refused += 1
    else:
        run.traces.append(trace)


async def closed_loop(
    url: str, streams: int, duration: float, seed: int, warmup: float = 5.0
) -> tuple[Run, float, float]:
    run = Run()
    start = time.perf_counter() + warmup
    stop = start + duration

    async def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.perf_counter() < stop:
            refused = run.refused
            await _one(url, *_request(rng), run)
            if run.refused > refused:
                await asyncio.sleep(0.1)  # a refused client must not spin on the client's core

    await asyncio.gather(*(client(i) for i in range(streams)))
    return run, start, stop


async def open_loop(
    url: str, rate: float, duration: float, seed: int, drain: float = 90.0
) -> tuple[Run, float, float, int]:
    run = Run()
    rng = random.Random(seed)
    start = time.perf_counter()
    stop = start + duration
    tasks = []
    next_at = start
    while next_at < stop:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        tasks.append(asyncio.ensure_future(_one(url, *_request(rng), run)))
        next_at += rng.expovariate(rate)
    _, pending = await asyncio.wait(tasks, timeout=drain)
    for task in pending:
        task.cancel()
    return run, start, stop, len(pending)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(run: Run, start: float, stop: float) -> dict[str, float]:
    ok = [t for t in run.traces if t.ok]
    in_window = sum(1 for t in ok for c in t.chunks if start <= c <= stop)
    chunks = sum(len(t.chunks) for t in ok)
    per_chunk = sum(t.output_tokens for t in ok) / chunks if chunks else 1.0
    ttft = [t.first - t.started for t in ok if t.first is not None and start <= t.started <= stop]
    gaps = [b - a for t in ok for a, b in zip(t.chunks, t.chunks[1:]) if start <= b <= stop]
    tpot = [(t.ended - t.first) / (t.output_tokens - 1) for t in ok if t.first and t.output_tokens > 1]
    return {
        "output_tokens_per_s": in_window * per_chunk / (stop - start),
        "requests_per_s": sum(1 for t in ok if start <= t.ended <= stop) / (stop - start),
        "ttft_p50_ms": 1e3 * _pct(ttft, 0.5),
        "ttft_p99_ms": 1e3 * _pct(ttft, 0.99),
        "itl_p50_ms": 1e3 * _pct(gaps, 0.5),
        "itl_p99_ms": 1e3 * _pct(gaps, 0.99),
        "itl_p99_over_p50": _pct(gaps, 0.99) / max(_pct(gaps, 0.5), 1e-9),
        "tpot_p50_ms": 1e3 * _pct(tpot, 0.5),
        "completed": len(ok),
        "failed": len(run.traces) - len(ok),
        "refused_429": run.refused,
    }


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _per_cpu(run: Run, sampler: Sampler, start: float, stop: float) -> dict[str, float]:
    ok = [t for t in run.traces if t.ok]
    chunks = sum(len(t.chunks) for t in ok)
    per_chunk = sum(t.output_tokens for t in ok) / chunks if chunks else 1.0
    tokens = sum(1 for t in ok for c in t.chunks if start <= c <= stop) * per_chunk
    cpu = sampler.cpu_between(start, stop)
    return {"server_cpu_share": cpu / (stop - start), "output_tokens_per_cpu_s": tokens / max(cpu, 1e-9)}


class Sampler(threading.Thread):
    """Polls the server's running and waiting sequences twice a second (the running-set size),
    and its CPU seconds: on a core shared with other work, tokens per CPU second of the server
    compare phases that got different shares of the core."""

    def __init__(self, url: str, pid: int) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.samples = url, threading.Event(), []  # type: ignore[var-annotated]
        self.pid, self.cpu = pid, [(time.perf_counter(), _cpu_seconds(pid))]

    def cpu_between(self, start: float, stop: float) -> float:
        """Server CPU seconds in [start, stop] (the nearest samples inside)."""
        inside = [c for t, c in self.cpu if start <= t <= stop]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.cpu.append((time.perf_counter(), _cpu_seconds(self.pid)))
            found = {}
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as reply:
                    for line in reply.read().decode().splitlines():
                        for name in ("running_sequences", "waiting_sequences"):
                            if line.startswith(f"ortserve_llm_{name}{{"):
                                found[name] = float(line.rsplit(" ", 1)[1])
            except OSError:
                continue
            if found:
                self.samples.append(found)

    def medians(self) -> dict[str, float]:
        self.stop.set()
        keys = ("running_sequences", "waiting_sequences")
        return {
            f"median_{k}": statistics.median(s.get(k, 0.0) for s in self.samples) if self.samples else 0.0
            for k in keys
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="new=genai")
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument(
        "--open-rate", default="1.3", help="open loop rates / closed-loop requests/s, comma-separated"
    )
    parser.add_argument(
        "--capacity-rps",
        type=float,
        default=0.0,
        help="requests/s the open-loop multiples apply to (0: each closed loop's own; on a shared "
        "core that moved 2x between minutes and the open loops of a slow minute were no overload)",
    )
    parser.add_argument(
        "--open-warmup",
        type=float,
        default=0.0,
        help="open loop: seconds after the first arrival not counted (the closed loop skips 5 s)",
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    variants = []
    for item in args.variants.split(","):
        name, _, rest = item.partition("=")
        layout, _, src = rest.partition(":")
        variants.append((name, layout, src))
    results: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, {layout for _, layout, _ in variants})
        for round_index in range(args.rounds):
            for name, layout, src in variants:
                env = dict(os.environ)
                if src:
                    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
                log = root / f"{name}.log"
                with run_server(
                    root / layout, log, ["--intra-op-threads", "1"], env=env, pin_cpu=0
                ) as server:
                    url = server.http_url
                    pid = server.process.pid
                    sampler = Sampler(url, pid)
                    sampler.start()
                    run, start, stop = asyncio.run(closed_loop(url, args.streams, args.duration, round_index))
                    closed = summary(run, start, stop) | _per_cpu(run, sampler, start, stop)
                    closed |= sampler.medians() | {"load_1m": os.getloadavg()[0]}
                    print(
                        f"{name} closed {args.streams}: {json.dumps({k: round(v, 1) for k, v in closed.items()})}",
                        flush=True,
                    )
                    result: dict[str, dict[str, float]] = {"closed": closed}
                    for multiple in (float(x) for x in args.open_rate.split(",")):
                        rate = multiple * max(closed["requests_per_s"], 0.05)
                        if args.capacity_rps:  # one offered load for every variant and round
                            rate = multiple * args.capacity_rps
                        sampler = Sampler(url, pid)
                        sampler.start()
                        run, start, stop, unfinished = asyncio.run(
                            open_loop(url, rate, args.duration, 100 + round_index)
                        )
                        opened = summary(run, start + args.open_warmup, stop)
                        opened |= _per_cpu(run, sampler, start + args.open_warmup, stop)
                        opened |= {"rate": rate, "unfinished_after_drain": unfinished}
                        opened["of_closed"] = opened["output_tokens_per_s"] / max(
                            closed["output_tokens_per_s"], 1e-9
                        )
                        opened["of_closed_per_cpu"] = opened["output_tokens_per_cpu_s"] / max(
                            closed["output_tokens_per_cpu_s"], 1e-9
                        )
                        opened |= sampler.medians() | {"load_1m": os.getloadavg()[0]}
                        print(
                            f"{name} open x{multiple}: {json.dumps({k: round(v, 2) for k, v in opened.items()})}",
                            flush=True,
                        )
                        result[f"open_x{multiple}"] = opened
                    results[name].append(result)
    medians = {
        name: {
            phase: {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]}
            for phase in runs[0]
        }
        for name, runs in results.items()
    }
    print(json.dumps(medians, indent=2))
    document = {"machine": machine_stamp(), "args": vars(args), "runs": results, "medians": medians,
                "load_after": os.getloadavg()}  # fmt: skip
    (OUT / "llm_mixed.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
